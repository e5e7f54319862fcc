//! `isolane models`: the built-in architectures with their size and cost.

use clap::Args;
use isolane_executors::listing;

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
    if args.json {
        println!("{}", listing::models_json()?);
    } else {
        println!("{}", listing::models_table());
    }
    Ok(0)
}
