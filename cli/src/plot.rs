//! `offload bench --plot`: throughput against request size, one panel per
//! algorithm, every backend and Auto, the break-even marked.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::bench::{AlgBench, Series, human};
use crate::setup::Error;

/// Where the plot's text metrics and glyphs come from.
const FONTS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

pub fn draw(path: &Path, results: &[AlgBench]) -> Result<(), Error> {
    if results.is_empty() {
        return Ok(());
    }
    let size = (1000, 440 * u32::try_from(results.len()).unwrap_or(1));
    let ext = path.extension().and_then(|e| e.to_str());
    if !matches!(ext, Some("png" | "svg")) {
        return Err("--plot takes a .svg or .png file".into());
    }
    let font = FONTS
        .iter()
        .find_map(|f| std::fs::read(f).ok())
        .ok_or("plots need the DejaVu Sans font (apt-get install fonts-dejavu-core)")?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| "the DejaVu Sans font did not load")?;
    if ext == Some("png") {
        render(BitMapBackend::new(path, size).into_drawing_area(), results)
    } else {
        render(SVGBackend::new(path, size).into_drawing_area(), results)
    }
}

fn render<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    results: &[AlgBench],
) -> Result<(), Error>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| -> Error { e.to_string().into() };
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((results.len(), 1));
    for (area, r) in panels.iter().zip(results) {
        panel(area, r).map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    r: &AlgBench,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let all: Vec<&Series> = r.backends.iter().chain(std::iter::once(&r.auto)).collect();
    let gbps: Vec<f64> = all
        .iter()
        .flat_map(|s| s.points.iter().flatten().map(|p| p.throughput / 1e9))
        .filter(|v| *v > 0.0)
        .collect();
    let (lo, hi) = gbps
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    if gbps.is_empty() {
        return Ok(());
    }
    // x is log2(size), so ticks fall on powers of two.
    let xmin = (*r.sizes.iter().min().unwrap_or(&16) as f64).log2().floor();
    let xmax = (*r.sizes.iter().max().unwrap_or(&16) as f64).log2().ceil();
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "{} — throughput by request size (Auto: {} policy)",
                r.alg, r.policy
            ),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (xmin..xmax * 1.05).log_scale(),
            (lo / 1.5..hi * 1.5).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("request size")
        .y_desc("GB/s")
        .x_labels(4 * (xmax - xmin) as usize)
        .x_label_formatter(&|x| human(x.exp2().round() as usize))
        .y_label_formatter(&|y| {
            if *y >= 0.01 {
                format!("{y:.2}")
            } else {
                format!("{y:.0e}")
            }
        })
        .draw()?;
    for (i, s) in all.iter().enumerate() {
        let is_auto = s.backend == "auto";
        let color = if is_auto {
            BLACK.to_rgba()
        } else {
            Palette99::pick(i).to_rgba()
        };
        let style = color.stroke_width(if is_auto { 3 } else { 2 });
        let line: Vec<(f64, f64)> = s
            .points
            .iter()
            .flatten()
            .map(|p| ((p.size as f64).log2(), p.throughput / 1e9))
            .collect();
        chart
            .draw_series(LineSeries::new(line.clone(), style))?
            .label(s.backend.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(line.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    if let Some(be) = r.break_even {
        let x = (be as f64).log2();
        if (xmin..=xmax).contains(&x) {
            let red = RED.stroke_width(1);
            chart
                .draw_series(LineSeries::new(vec![(x, lo / 1.5), (x, hi * 1.5)], red))?
                .label(format!("break-even {}", human(be)))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
