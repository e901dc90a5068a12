//! The plot: handoff latency CDFs of W3 and W4, drawn to `handoff.png`.

use std::path::Path;

// ---------------------------------------------------------------------------------------------
// The plot: handoff latency CDFs.

fn load_font() -> bool {
    use plotters::style::FontStyle;
    let candidates = std::env::var("FENCELOCK_BENCH_FONT")
        .map(|f| vec![f])
        .unwrap_or_else(|_| {
            [
                "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                "/usr/share/fonts/TTF/DejaVuSans.ttf",
                "/usr/share/fonts/dejavu/DejaVuSans.ttf",
                "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
            ]
            .map(String::from)
            .to_vec()
        });
    for path in candidates {
        if let Ok(bytes) = std::fs::read(&path) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
    }
    false
}

/// One CDF line: handoff latencies in µs.
pub struct Series {
    pub label: String,
    pub values: Vec<f64>,
    pub color: usize,
    pub dashed: bool,
}

/// One plot panel: title, raw RTT in µs, lines.
pub type Panel = (String, f64, Vec<Series>);

pub fn plot(path: &Path, panels: &[Panel]) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let text = load_font();
    if !text {
        eprintln!(
            "no TrueType font found (set FENCELOCK_BENCH_FONT); drawing the plot without text"
        );
    }
    let (width, chart_height, legend_height) = (620u32, 440u32, 175u32);
    let root = BitMapBackend::new(
        path,
        (
            width * panels.len().max(1) as u32,
            chart_height + legend_height,
        ),
    )
    .into_drawing_area();
    root.fill(&WHITE)?;
    let colors = [
        RGBColor(0, 90, 181),
        RGBColor(220, 50, 32),
        RGBColor(0, 150, 60),
        RGBColor(140, 80, 160),
    ];
    for (panel_area, (title, rtt, series)) in root
        .split_evenly((1, panels.len().max(1)))
        .iter()
        .zip(panels)
    {
        // The chart on top, its legend below it (a legend inside would hide curves).
        let (area, legend) = panel_area.split_vertically(chart_height);
        let values = series.iter().flat_map(|s| s.values.iter().copied());
        let lo = values
            .clone()
            .filter(|v| *v > 0.0)
            .fold(f64::INFINITY, f64::min)
            .max(1.0)
            / 1000.0;
        let hi = values.fold(0.0, f64::max).max(1.0) / 1000.0 * 1.2;
        let lo = (lo * 0.8).min(hi / 10.0);
        let mut builder = ChartBuilder::on(&area);
        builder.margin(15);
        if text {
            builder
                .caption(title, ("sans-serif", 20))
                .x_label_area_size(45)
                .y_label_area_size(55);
        }
        let mut chart = builder.build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)?;
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc("handoff latency (ms, log scale)")
                .y_desc("fraction of handoffs ≤ x")
                .x_label_formatter(&|v| format!("{v}"))
                .label_style(("sans-serif", 13));
        } else {
            mesh.x_labels(0).y_labels(0);
        }
        mesh.draw()?;
        let rtt_ms = rtt / 1000.0;
        chart.draw_series(DashedLineSeries::new(
            vec![(rtt_ms, 0.0), (rtt_ms, 1.0)],
            4,
            4,
            BLACK.stroke_width(1),
        ))?;
        // (label, color, dashed, thin)
        let mut entries = vec![(
            format!("1 raw RTT ({rtt:.0} µs), measured in the same run"),
            BLACK,
            true,
            true,
        )];
        for line in series {
            if line.values.is_empty() {
                continue;
            }
            let mut sorted = line.values.clone();
            sorted.sort_by(f64::total_cmp);
            let n = sorted.len();
            let step = (n / 2000).max(1);
            let mut points: Vec<(f64, f64)> = sorted
                .iter()
                .enumerate()
                .filter(|(j, _)| j % step == 0 || *j == n - 1)
                .map(|(j, v)| ((v / 1000.0).max(lo), (j + 1) as f64 / n as f64))
                .collect();
            points.insert(0, (points[0].0, 0.0));
            let color = colors[line.color % colors.len()];
            if line.dashed {
                chart.draw_series(DashedLineSeries::new(points, 6, 4, color.stroke_width(2)))?;
            } else {
                chart.draw_series(LineSeries::new(points, color.stroke_width(2)))?;
            }
            entries.push((
                format!("{} (n = {n})", line.label),
                color,
                line.dashed,
                false,
            ));
        }
        if text {
            let rows = entries.len() as i32;
            legend.draw(&Text::new(
                "* peers: no re-entry, no fencing tokens",
                (70, 8 + 19 * rows - 7),
                ("sans-serif", 13).into_font().color(&BLACK.mix(0.6)),
            ))?;
            for (i, (label, color, dashed, thin)) in entries.into_iter().enumerate() {
                let (x, y) = (70, 8 + 19 * i as i32);
                let style = color.stroke_width(if thin { 1 } else { 2 });
                if dashed {
                    for dash in 0..3 {
                        let x0 = x + dash * 10;
                        legend.draw(&PathElement::new(vec![(x0, y), (x0 + 6, y)], style))?;
                    }
                } else {
                    legend.draw(&PathElement::new(vec![(x, y), (x + 26, y)], style))?;
                }
                legend.draw(&Text::new(label, (x + 36, y - 7), ("sans-serif", 14)))?;
            }
        }
    }
    root.present()?;
    Ok(())
}
