//! `isolane models`: the built-in architectures with their size and cost.

use clap::Args;
use isolane_engine::builtin_models;

#[derive(Args)]
#[command(
    about = "List the built-in models: parameters, GFLOPs per image, input shape",
    long_about = "Lists the built-in architectures (torchvision's, and Ultralytics' yolov8n) with \
                  their trainable-parameter count, floating-point operations per image (2 × \
                  multiply-accumulates of convolutions and matrix products) and per-image input \
                  shape. Any of them can be named in `isolane infer --model` and in scenarios; \
                  a path to an .onnx file works there too."
)]
pub struct ModelsArgs {
    /// Print JSON (an array of objects) instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: ModelsArgs) -> anyhow::Result<u8> {
    let models = builtin_models();
    if args.json {
        let v: Vec<serde_json::Value> = models
            .iter()
            .map(|m| {
                serde_json::json!({
                    "name": m.name,
                    "params": m.params,
                    "gflops_per_image": m.gflops_per_image,
                    "input_shape": m.input_shape,
                    "output_shape": m.output_shape,
                    "description": m.description,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    let rows: Vec<[String; 5]> = models
        .iter()
        .map(|m| {
            [
                m.name.to_string(),
                group_thousands(m.params),
                format!("{:.2}", m.gflops_per_image),
                shape(&m.input_shape),
                m.description.to_string(),
            ]
        })
        .collect();
    // 80 columns: the description wraps inside its cell.
    let rows: Vec<Vec<String>> = rows.into_iter().map(Vec::from).collect();
    println!(
        "{}",
        isolane_report::plain_table(
            &["model", "params", "GFLOP/img", "input", "description"],
            &rows,
            &[0, 3, 4]
        )
    );
    Ok(0)
}

fn shape(s: &[usize]) -> String {
    s.iter().map(usize::to_string).collect::<Vec<_>>().join("x")
}

fn group_thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands() {
        assert_eq!(super::group_thousands(11_689_512), "11,689,512");
        assert_eq!(super::group_thousands(512), "512");
        assert_eq!(super::group_thousands(1000), "1,000");
    }
}
