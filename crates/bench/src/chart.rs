//! The PNG chart of submit throughput and p99 latency against concurrency (plotters, bitmap
//! backend). Text is drawn with `ab_glyph` from a TrueType file read at run time — no fontconfig
//! or other system library is needed to build — so a machine without the font file gets an error
//! (which the harness reports) instead of a chart.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// Where fonts usually are.
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
];

/// One concurrency level: (min, median, max) of throughput and of p99.
#[derive(Debug, Clone)]
pub struct Point {
    /// Concurrent clients.
    pub clients: usize,
    /// Submits per second.
    pub per_s: (f64, f64, f64),
    /// p99 latency, ms.
    pub p99_ms: (f64, f64, f64),
}

fn find_font(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(path.to_path_buf());
    }
    FONT_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
        .ok_or_else(|| anyhow!("no TrueType font found (pass --chart-font PATH)"))
}

fn plot_err<E: std::fmt::Display>(error: E) -> anyhow::Error {
    anyhow!("drawing the chart: {error}")
}

/// Draws the chart into `path` (PNG).
pub fn draw(path: &Path, font: Option<&Path>, points: &[Point], note: &str) -> anyhow::Result<()> {
    if points.is_empty() {
        return Err(anyhow!("no submit figures to draw"));
    }
    let font_path = find_font(font)?;
    let bytes = std::fs::read(&font_path)
        .with_context(|| format!("cannot read the font {}", font_path.display()))?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("{} is not a usable font", font_path.display()))?;

    let max_rate = points.iter().map(|p| p.per_s.2).fold(1.0, f64::max) * 1.15;
    let max_p99 = points.iter().map(|p| p.p99_ms.2).fold(1.0, f64::max) * 1.15;
    let x_max = points.iter().map(|p| p.clients).max().unwrap_or(1) as f64 * 1.4;

    let ticks: Vec<f64> = points.iter().map(|p| p.clients as f64).collect();
    let root = BitMapBackend::new(path, (1000, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let (title_area, plot_area) = root.split_vertically(70);
    title_area
        .draw_text(
            "LMSP durable background submits (HTTP 202) vs concurrent clients",
            &("sans-serif", 22).into_font().color(&BLACK),
            (20, 12),
        )
        .map_err(plot_err)?;
    title_area
        .draw_text(
            note,
            &("sans-serif", 14).into_font().color(&RGBColor(90, 90, 90)),
            (20, 44),
        )
        .map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .right_y_label_area_size(80)
        .build_cartesian_2d(
            (0.8f64..x_max).log_scale().with_key_points(ticks.clone()),
            0f64..max_rate,
        )
        .map_err(plot_err)?
        .set_secondary_coord(
            (0.8f64..x_max).log_scale().with_key_points(ticks),
            0f64..max_p99,
        );
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc("concurrent clients (log scale)")
        .y_desc("submits per second (median; bars: min-max)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()
        .map_err(plot_err)?;
    chart
        .configure_secondary_axes()
        .y_desc("p99 latency, ms")
        .y_label_formatter(&|y| format!("{y:.1}"))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()
        .map_err(plot_err)?;

    let blue = RGBColor(31, 119, 180);
    let red = RGBColor(214, 39, 40);
    chart
        .draw_series(LineSeries::new(
            points.iter().map(|p| (p.clients as f64, p.per_s.1)),
            blue.stroke_width(3),
        ))
        .map_err(plot_err)?
        .label("submits/s")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], blue.stroke_width(3)));
    chart
        .draw_series(
            points
                .iter()
                .map(|p| Circle::new((p.clients as f64, p.per_s.1), 5, blue.filled())),
        )
        .map_err(plot_err)?;
    chart
        .draw_series(points.iter().map(|p| {
            let x = p.clients as f64;
            PathElement::new(vec![(x, p.per_s.0), (x, p.per_s.2)], blue.stroke_width(2))
        }))
        .map_err(plot_err)?;
    chart
        .draw_secondary_series(LineSeries::new(
            points.iter().map(|p| (p.clients as f64, p.p99_ms.1)),
            red.stroke_width(3),
        ))
        .map_err(plot_err)?
        .label("p99 latency (right axis)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red.stroke_width(3)));
    chart
        .draw_secondary_series(
            points
                .iter()
                .map(|p| TriangleMarker::new((p.clients as f64, p.p99_ms.1), 6, red.filled())),
        )
        .map_err(plot_err)?;
    chart
        .draw_secondary_series(points.iter().map(|p| {
            let x = p.clients as f64;
            PathElement::new(vec![(x, p.p99_ms.0), (x, p.p99_ms.2)], red.stroke_width(2))
        }))
        .map_err(plot_err)?;
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}
