//! Line charts as SVG strings, drawn with plotters' SVG backend.
//!
//! Text is emitted as SVG `<text>` (plotters is built without its `ttf` feature), so the browser
//! lays it out with its own fonts and nothing here reads system fonts.

use plotters::prelude::*;

/// Series colours (Tableau 10): distinct in print and for most colour-vision deficiencies. The
/// browser test recognises drawn data by these colours.
pub const PALETTE: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

pub fn palette_hex() -> Vec<String> {
    PALETTE
        .iter()
        .map(|(r, g, b)| format!("#{r:02X}{g:02X}{b:02X}"))
        .collect()
}

#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A dashed vertical line across a chart at `x` (a deadline), named in the legend.
#[derive(Debug, Clone)]
pub struct VLine {
    pub label: String,
    pub x: f64,
    pub colour: (u8, u8, u8),
}

#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Start the y axis at 0 (quantities such as throughput or power), instead of fitting it.
    pub y_from_zero: bool,
    /// Fixed y range (a CDF's 0..1, a percentage's 0..100).
    pub y_range: Option<(f64, f64)>,
    /// Mark every point (sweeps with a few points), not just the line.
    pub markers: bool,
    /// Shown under the chart in the report: where the data comes from.
    pub caption: String,
    /// Legend in the lower right (CDFs rise to the upper left, where it would hide them).
    pub legend_lower_right: bool,
    /// Vertical markers (deadlines); the x axis is widened to hold them.
    pub vlines: Vec<VLine>,
}

impl Chart {
    pub fn new(title: impl Into<String>, x: impl Into<String>, y: impl Into<String>) -> Chart {
        Chart {
            title: title.into(),
            x_label: x.into(),
            y_label: y.into(),
            series: Vec::new(),
            y_from_zero: false,
            y_range: None,
            markers: false,
            caption: String::new(),
            legend_lower_right: false,
            vlines: Vec::new(),
        }
    }

    pub fn series(mut self, label: impl Into<String>, points: Vec<(f64, f64)>) -> Chart {
        let points: Vec<(f64, f64)> = points
            .into_iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        if !points.is_empty() {
            self.series.push(Series {
                label: label.into(),
                points,
            });
        }
        self
    }

    /// A chart with no finite point has nothing to show; callers leave it out.
    pub fn is_empty(&self) -> bool {
        self.series.iter().all(|s| s.points.is_empty())
    }
}

fn span(lo: f64, hi: f64) -> (f64, f64) {
    if !(lo.is_finite() && hi.is_finite()) {
        return (0.0, 1.0);
    }
    if hi - lo < 1e-12 {
        // A constant series still needs a visible axis around it.
        let pad = if lo.abs() > 1e-9 { lo.abs() * 0.1 } else { 1.0 };
        return (lo - pad, hi + pad);
    }
    let pad = (hi - lo) * 0.05;
    (lo - pad, hi + pad)
}

fn extent(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    })
}

/// Draws the chart as a standalone `<svg>` element of `width × height` px.
pub fn svg(chart: &Chart, width: u32, height: u32) -> Result<String, String> {
    let (x0, x1) = extent(
        chart
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .chain(chart.vlines.iter().map(|v| v.x).filter(|x| x.is_finite())),
    );
    let (x0, x1) = span(x0, x1);
    let (y0, y1) = match chart.y_range {
        Some(r) => r,
        None => {
            let (lo, hi) = extent(
                chart
                    .series
                    .iter()
                    .flat_map(|s| s.points.iter().map(|p| p.1)),
            );
            let (lo, hi) = if chart.y_from_zero && lo >= 0.0 {
                (0.0, hi)
            } else {
                (lo, hi)
            };
            let (a, b) = span(lo, hi);
            if chart.y_from_zero && lo >= 0.0 {
                (0.0, b)
            } else {
                (a, b)
            }
        }
    };
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut c = ChartBuilder::on(&root)
            .caption(&chart.title, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| e.to_string())?;
        c.configure_mesh()
            .x_desc(chart.x_label.as_str())
            .y_desc(chart.y_label.as_str())
            .axis_desc_style(("sans-serif", 14))
            .label_style(("sans-serif", 12))
            .light_line_style(RGBColor(244, 244, 244))
            .bold_line_style(RGBColor(218, 218, 218))
            .max_light_lines(2)
            .x_labels(8)
            .y_labels(6)
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, s) in chart.series.iter().enumerate() {
            let (r, g, b) = PALETTE[i % PALETTE.len()];
            let color = RGBColor(r, g, b);
            c.draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(s.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
            if chart.markers || s.points.len() == 1 {
                c.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| e.to_string())?;
            }
        }
        for v in chart.vlines.iter().filter(|v| v.x.is_finite()) {
            let (r, g, b) = v.colour;
            let colour = RGBColor(r, g, b);
            c.draw_series(DashedLineSeries::new(
                [(v.x, y0), (v.x, y1)],
                6,
                4,
                colour.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(v.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 6, y)], colour.stroke_width(2))
            });
        }
        // One series is named by the title already; a legend would only hide data.
        if chart.series.len() + chart.vlines.len() > 1 {
            c.configure_series_labels()
                .position(if chart.legend_lower_right {
                    SeriesLabelPosition::LowerRight
                } else {
                    SeriesLabelPosition::UpperLeft
                })
                .background_style(WHITE.mix(0.85))
                .border_style(RGBColor(180, 180, 180))
                .label_font(("sans-serif", 12))
                .draw()
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// An axis label without noise: `300` rather than `300.0`, at most 3 significant decimals.
fn tick(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    let digits = if a >= 100.0 {
        0
    } else if a >= 10.0 {
        1
    } else if a >= 1.0 {
        2
    } else {
        3
    };
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// At most `n` points of an empirical CDF of sorted values: enough for a smooth curve, few
/// enough that a 100 000-job run does not make a 10 MB page. The extremes are always kept.
pub fn cdf_points(sorted: &[f64], n: usize) -> Vec<(f64, f64)> {
    let len = sorted.len();
    if len == 0 {
        return Vec::new();
    }
    let n = n.max(2);
    if len <= n {
        return sorted
            .iter()
            .enumerate()
            .map(|(i, &v)| (v, (i + 1) as f64 / len as f64))
            .collect();
    }
    let mut out: Vec<(f64, f64)> = (0..n)
        .map(|k| {
            let i = ((len - 1) as f64 * k as f64 / (n - 1) as f64).round() as usize;
            (sorted[i], (i + 1) as f64 / len as f64)
        })
        .collect();
    out.dedup_by(|a, b| a == b);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_has_series_colour_text_and_no_font_file() {
        let c = Chart::new("t", "x", "y").series("a", vec![(0.0, 1.0), (1.0, 2.0)]);
        let s = svg(&c, 400, 300).unwrap();
        assert!(s.starts_with("<svg"), "{}", &s[..50]);
        assert!(s.contains("<text"));
        assert!(
            s.to_uppercase().contains(&palette_hex()[0]),
            "series colour missing"
        );
    }

    #[test]
    fn constant_and_single_point_series_still_draw() {
        let c = Chart::new("t", "x", "y").series("a", vec![(5.0, 3.0)]);
        assert!(svg(&c, 300, 200).unwrap().contains("<circle"));
        let c = Chart::new("t", "x", "y").series("nan", vec![(f64::NAN, 1.0)]);
        assert!(c.is_empty());
    }

    #[test]
    fn a_vertical_line_widens_the_axis_and_is_named() {
        let mut c = Chart::new("t", "ms", "y").series("a", vec![(1.0, 0.5), (2.0, 1.0)]);
        let plain = svg(&c, 400, 300).unwrap();
        c.vlines.push(VLine {
            label: "deadline 10 ms".into(),
            x: 10.0,
            colour: (1, 2, 3),
        });
        let s = svg(&c, 400, 300).unwrap();
        assert!(s.contains("deadline 10 ms"), "no legend entry");
        assert!(s.to_uppercase().contains("#010203"), "line not drawn");
        // The axis reaches the deadline: a tick at 10 appears only with the line.
        // (plotters writes each text on a line of its own)
        assert!(s.contains(">\n10\n<") && !plain.contains(">\n10\n<"));
    }

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(300.0), "300");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(0.125), "0.125");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(12.25), "12.2");
    }

    #[test]
    fn cdf_is_monotone_capped_and_keeps_extremes() {
        let v: Vec<f64> = (0..10_000).map(|i| i as f64).collect();
        let p = cdf_points(&v, 200);
        assert!(p.len() <= 200);
        assert_eq!(p.first().unwrap().0, 0.0);
        assert_eq!(p.last().unwrap(), &(9999.0, 1.0));
        assert!(p.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(cdf_points(&[2.0], 10), vec![(2.0, 1.0)]);
    }
}

/// One stacked bar: its label and its segments (label, value) from the bottom up.
#[derive(Debug, Clone)]
pub struct StackedBar {
    pub label: String,
    pub segments: Vec<(String, f64)>,
}

/// Stacked bars as a standalone `<svg>`: one bar per entry, each segment in the next palette
/// colour, every segment named in the legend.
pub fn stacked_bars_svg(
    title: &str,
    y_label: &str,
    bars: &[StackedBar],
    width: u32,
    height: u32,
) -> Result<String, String> {
    let top = bars
        .iter()
        .map(|b| b.segments.iter().map(|s| s.1.max(0.0)).sum::<f64>())
        .fold(0.0, f64::max);
    let top = if top > 0.0 { top * 1.1 } else { 1.0 };
    let n = bars.len().max(1) as f64;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut c = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..n, 0.0..top)
            .map_err(|e| e.to_string())?;
        let labels: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
        c.configure_mesh()
            .disable_x_mesh()
            .y_desc(y_label)
            .axis_desc_style(("sans-serif", 14))
            .label_style(("sans-serif", 12))
            .light_line_style(RGBColor(244, 244, 244))
            .bold_line_style(RGBColor(218, 218, 218))
            .x_labels(bars.len() * 2 + 1)
            .x_label_formatter(&|v| {
                let i = v.floor() as usize;
                let centred = (v - v.floor() - 0.5).abs() < 1e-9;
                if centred {
                    labels.get(i).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| tick(*v))
            .draw()
            .map_err(|e| e.to_string())?;
        let mut colour = 0;
        for (i, bar) in bars.iter().enumerate() {
            let mut base = 0.0;
            for (name, v) in &bar.segments {
                let v = v.max(0.0);
                let (r, g, b) = PALETTE[colour % PALETTE.len()];
                colour += 1;
                let fill = RGBColor(r, g, b);
                let x = i as f64;
                c.draw_series(std::iter::once(Rectangle::new(
                    [(x + 0.2, base), (x + 0.8, base + v)],
                    fill.filled(),
                )))
                .map_err(|e| e.to_string())?
                .label(format!("{}: {name}", bar.label))
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], fill.filled()));
                base += v;
            }
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}
