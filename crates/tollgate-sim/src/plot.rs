//! The plot: two panels sharing the time axis.
//!
//! - Top: offered and admitted requests per time bucket, one line per algorithm.
//! - Bottom: admitted requests in the trailing window of one quota period (sampled at each bucket's
//!   end), the limit as a dashed line, and each algorithm's worst window (the number in the table)
//!   as a thick segment spanning that window at its height, ending in a dot.
//!
//! For [`crate::Traffic::Clients`], one panel per algorithm instead: the cost admitted in the
//! trailing quota period (sampled at each bucket's end), reserving and settling against checking
//! then charging, the limit as a dashed line; the caption gives each way's overshoot (the table's).
//!
//! SVG or PNG by the file's extension. Text uses a font built into the binary (Hack, from
//! `epaint_default_fonts`), so the output does not depend on the fonts installed and the same
//! simulation draws the same bytes.

use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::algorithm::AlgorithmKind;
use crate::error::SimError;
use crate::settle::{Way, trailing_cost};
use crate::units::{Span, nanos};
use crate::window::{Worst, bucket_counts, trailing_counts};
use crate::{Simulation, Traffic};

/// Plot width in pixels.
pub const WIDTH: u32 = 1200;
/// Plot height in pixels.
pub const HEIGHT: u32 = 800;
/// At most this many time buckets: a longer simulation gets wider buckets.
pub const MAX_BUCKETS: u64 = 1000;

const FONT: &str = "monospace";

/// The image format, chosen by the output file's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `.svg`
    Svg,
    /// `.png`
    Png,
}

impl Format {
    /// `.svg` or `.png` (any case); anything else is an error naming the path.
    pub fn from_path(path: &Path) -> Result<Format, SimError> {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => Err(SimError::invalid("--out", &path.display().to_string(), "the plot file must end in .svg or .png")),
        }
    }
}

/// Most buckets a `--bucket` width may cut a simulation into.
pub const MAX_DRAWN_BUCKETS: u64 = 100 * MAX_BUCKETS;

/// Checks that buckets of `bucket` cut `duration` into at most [`MAX_DRAWN_BUCKETS`].
pub fn check_bucket(duration: Duration, bucket: Duration) -> Result<(), SimError> {
    let width = nanos(bucket);
    let buckets = nanos(duration).div_ceil(width.max(1));
    if width == 0 || buckets > MAX_DRAWN_BUCKETS {
        return Err(SimError::invalid(
            "--bucket",
            &Span(bucket).to_string(),
            format!("cuts {} into {buckets} buckets; at most {MAX_DRAWN_BUCKETS} can be drawn", Span(duration)),
        ));
    }
    Ok(())
}

/// The default bucket: a tenth of the quota's period, widened so there are at most
/// [`MAX_BUCKETS`].
pub fn default_bucket(sim: &Simulation) -> Duration {
    let tenth = nanos(sim.scenario.quota.period()) / 10;
    let widest = nanos(sim.scenario.duration).div_ceil(MAX_BUCKETS);
    Duration::from_nanos(tenth.max(widest).max(1))
}

/// Why a plot could not be drawn or encoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RenderError {
    /// The font built into the binary could not be registered.
    #[error("the built-in font could not be loaded")]
    Font,
    /// The buckets are too narrow for the simulated duration.
    #[error("{buckets} buckets of {} are too many to draw (at most {MAX_DRAWN_BUCKETS})", Span(*bucket))]
    TooManyBuckets {
        /// How many there would be.
        buckets: u64,
        /// The bucket width.
        bucket: Duration,
    },
    /// The drawing library failed.
    #[error("{0}")]
    Draw(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The PNG encoder failed.
    #[error("{0}")]
    Png(#[source] png::EncodingError),
}

/// Draws `sim` in `format` with buckets of `bucket` (default: [`default_bucket`]).
pub fn render(sim: &Simulation, format: Format, bucket: Option<Duration>) -> Result<Vec<u8>, RenderError> {
    register_font()?;
    let bucket = bucket.unwrap_or_else(|| default_bucket(sim));
    let data = match sim.scenario.traffic {
        Traffic::Clients(_) => Data::Costs(CostPlotData::new(sim, bucket)?),
        _ => Data::Arrivals(PlotData::new(sim, bucket)?),
    };
    let drawn = |e: Box<dyn std::error::Error + Send + Sync>| RenderError::Draw(e);
    fn draw_any<DB: DrawingBackend>(
        root: &DrawingArea<DB, Shift>,
        data: &Data,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        match data {
            Data::Arrivals(data) => draw(root, data),
            Data::Costs(data) => draw_costs(root, data),
        }
    }
    match format {
        Format::Svg => {
            let mut svg = String::new();
            {
                let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
                draw_any(&root, &data).map_err(|e| drawn(Box::new(e)))?;
            }
            Ok(svg.into_bytes())
        }
        Format::Png => {
            let mut rgb = vec![0u8; WIDTH as usize * HEIGHT as usize * 3];
            {
                let root = BitMapBackend::with_buffer(&mut rgb, (WIDTH, HEIGHT)).into_drawing_area();
                draw_any(&root, &data).map_err(|e| drawn(Box::new(e)))?;
            }
            let mut png_bytes = Vec::new();
            let mut encoder = png::Encoder::new(&mut png_bytes, WIDTH, HEIGHT);
            encoder.set_color(png::ColorType::Rgb);
            encoder.set_depth(png::BitDepth::Eight);
            let mut writer = encoder.write_header().map_err(RenderError::Png)?;
            writer.write_image_data(&rgb).map_err(RenderError::Png)?;
            writer.finish().map_err(RenderError::Png)?;
            Ok(png_bytes)
        }
    }
}

/// Draws `sim` into `path`, SVG or PNG by its extension.
pub fn write(sim: &Simulation, path: &Path, bucket: Option<Duration>) -> Result<(), SimError> {
    let format = Format::from_path(path)?;
    if let Some(b) = bucket {
        check_bucket(sim.scenario.duration, b)?;
    }
    let bytes = render(sim, format, bucket).map_err(|source| SimError::Plot { path: path.to_owned(), source })?;
    std::fs::write(path, bytes).map_err(|source| SimError::PlotWrite { path: path.to_owned(), source })
}

fn register_font() -> Result<(), RenderError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, epaint_default_fonts::HACK_REGULAR).is_ok()
    });
    if ok { Ok(()) } else { Err(RenderError::Font) }
}

fn color(kind: AlgorithmKind) -> RGBColor {
    match kind {
        AlgorithmKind::TokenBucket => RGBColor(31, 119, 180),
        AlgorithmKind::IntervalBucket => RGBColor(255, 127, 14),
        AlgorithmKind::FixedWindow => RGBColor(214, 39, 40),
        AlgorithmKind::SlidingWindow => RGBColor(44, 160, 44),
        AlgorithmKind::WeightedWindow => RGBColor(148, 103, 189),
        AlgorithmKind::SlidingLog => RGBColor(140, 86, 75),
    }
}

const OFFERED: RGBColor = RGBColor(150, 150, 150);

fn way_color(way: Way) -> RGBColor {
    match way {
        Way::ReserveSettle => RGBColor(31, 119, 180),
        Way::CheckThenCharge => RGBColor(214, 39, 40),
    }
}

/// What a plot draws: arrivals through each algorithm, or clients' costs each way.
enum Data {
    Arrivals(PlotData),
    Costs(CostPlotData),
}

/// One way's line in a cost panel.
struct CostLine {
    way: Way,
    trailing: Vec<u64>,
    overshoot: u64,
}

/// One algorithm's panel.
struct CostPanel {
    kind: AlgorithmKind,
    lines: Vec<CostLine>,
}

/// The run's end and the buckets' width (ns), and how many buckets of `bucket` cut `duration`:
/// at most [`MAX_DRAWN_BUCKETS`].
fn cut(duration: Duration, bucket: Duration) -> Result<(u64, u64, u64), RenderError> {
    let end = nanos(duration);
    let width = nanos(bucket).max(1);
    let buckets = end.div_ceil(width);
    if buckets > MAX_DRAWN_BUCKETS {
        return Err(RenderError::TooManyBuckets { buckets, bucket });
    }
    Ok((end, width, buckets))
}

/// Everything the cost panels draw.
struct CostPlotData {
    title: String,
    period: Duration,
    limit: u64,
    end_s: f64,
    /// Sample times in seconds (each bucket's end), from zero.
    samples: Vec<f64>,
    panels: Vec<CostPanel>,
}

impl CostPlotData {
    fn new(sim: &Simulation, bucket: Duration) -> Result<CostPlotData, RenderError> {
        let s = &sim.scenario;
        let (end, width, buckets) = cut(s.duration, bucket)?;
        // The trailing window ending at each bucket's end: (end - 1 - period, end - 1].
        let sample_ns: Vec<u64> = (1..=buckets).map(|k| (k * width).min(end).saturating_sub(1)).collect();
        let period = nanos(s.quota.period());
        let mut panels: Vec<CostPanel> = Vec::new();
        for run in &sim.cost_runs {
            let line = CostLine {
                way: run.way,
                trailing: trailing_cost(&run.admitted, period, &sample_ns),
                overshoot: run.worst.overshoot(),
            };
            match panels.last_mut() {
                Some(panel) if panel.kind == run.algorithm => panel.lines.push(line),
                _ => panels.push(CostPanel { kind: run.algorithm, lines: vec![line] }),
            }
        }
        Ok(CostPlotData {
            title: format!("{} against {} per {}", s.traffic.label(), s.quota.limit(), Span(s.quota.period())),
            period: s.quota.period(),
            limit: s.quota.limit(),
            end_s: secs(end),
            samples: std::iter::once(0.0).chain(sample_ns.iter().map(|&t| secs(t + 1))).collect(),
            panels,
        })
    }
}

fn draw_costs<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    p: &CostPlotData,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let area = root.titled(&p.title, (FONT, 20))?;
    let (charts, legends) = area.split_horizontally(area.dim_in_pixel().0 as i32 - LEGEND_WIDTH);
    let mut entries =
        vec![Entry { color: BLACK, stroke: 2, dot: false, dashed: true, text: format!("limit {}", p.limit) }];
    for way in Way::BOTH {
        entries.push(Entry { color: way_color(way), stroke: 2, dot: false, dashed: false, text: way.name().into() });
    }
    legend(&legends, &entries)?;
    let font = (FONT, 12).into_font().color(&BLACK);
    let notes = [
        "cost admitted in the".to_owned(),
        format!("trailing {}, sampled", Span(p.period)),
        "at each bucket's end".to_owned(),
        String::new(),
        "caption: worst overshoot".to_owned(),
        "(the table's) each way".to_owned(),
    ];
    for (i, note) in notes.iter().enumerate().filter(|(_, note)| !note.is_empty()) {
        legends.draw(&Text::new(note.clone(), (10, 48 + 20 * (entries.len() as i32 + 1 + i as i32)), font.clone()))?;
    }
    let n = p.panels.len().max(1);
    let cols = if n == 1 { 1 } else { 2 };
    let rows = n.div_ceil(cols);
    let cells = charts.split_evenly((rows, cols));
    let top = p.panels.iter().flat_map(|c| c.lines.iter().flat_map(|l| l.trailing.iter().copied())).max().unwrap_or(0);
    let count_label = |v: &f64| format!("{v:.0}");
    for (panel, cell) in p.panels.iter().zip(cells.iter()) {
        let overshoots: Vec<String> =
            panel.lines.iter().map(|l| format!("{} {}", short_way(l.way), l.overshoot)).collect();
        let mut chart = ChartBuilder::on(cell)
            .caption(format!("{}: over by {}", panel.kind.name(), overshoots.join(", ")), (FONT, 14))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..p.end_s, y_range(top.max(p.limit)))?;
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(BLACK.mix(0.08))
            .x_desc("time (s)")
            .y_label_formatter(&count_label)
            .label_style((FONT, 11))
            .draw()?;
        let limit = p.limit as f64;
        chart.draw_series(DashedLineSeries::new([(0.0, limit), (p.end_s, limit)], 10, 6, BLACK.stroke_width(2)))?;
        // Checking first is drawn first, so the reservations' line stays visible over it.
        for line in panel.lines.iter().rev() {
            let points =
                p.samples.iter().copied().zip(std::iter::once(0.0).chain(line.trailing.iter().map(|&c| c as f64)));
            chart.draw_series(LineSeries::new(points, way_color(line.way).stroke_width(2)))?;
        }
    }
    root.present()
}

/// A way's name in a caption.
fn short_way(way: Way) -> &'static str {
    match way {
        Way::ReserveSettle => "reserving",
        Way::CheckThenCharge => "checking",
    }
}

struct Line {
    kind: AlgorithmKind,
    per_bucket: Vec<u64>,
    trailing: Vec<u64>,
    worst: Worst,
}

/// Everything the panels draw, in seconds and counts.
struct PlotData {
    title: String,
    bucket: Duration,
    period: Duration,
    limit: u64,
    end_s: f64,
    /// Bucket edges in seconds: `edges[k]..edges[k + 1]` is bucket `k`.
    edges: Vec<f64>,
    offered: Vec<u64>,
    lines: Vec<Line>,
}

impl PlotData {
    fn new(sim: &Simulation, bucket: Duration) -> Result<PlotData, RenderError> {
        let s = &sim.scenario;
        let (end, width, buckets) = cut(s.duration, bucket)?;
        let buckets = buckets as usize;
        let edge_ns: Vec<u64> = (0..=buckets as u64).map(|k| (k * width).min(end)).collect();
        // The trailing window ending at each bucket's end: (end - 1 - period, end - 1].
        let samples: Vec<u64> = edge_ns[1..].iter().map(|&e| e.saturating_sub(1)).collect();
        let period = nanos(s.quota.period());
        let lines = sim
            .runs
            .iter()
            .map(|r| Line {
                kind: r.algorithm,
                per_bucket: bucket_counts(&r.admitted, width, buckets),
                trailing: trailing_counts(&r.admitted, period, &samples),
                worst: r.worst,
            })
            .collect();
        Ok(PlotData {
            title: format!(
                "{} against {} per {} (burst {})",
                s.traffic.label(),
                s.quota.limit(),
                Span(s.quota.period()),
                s.quota.burst()
            ),
            bucket: Duration::from_nanos(width),
            period: s.quota.period(),
            limit: s.quota.limit(),
            end_s: secs(end),
            edges: edge_ns.iter().map(|&e| secs(e)).collect(),
            offered: bucket_counts(&sim.offered, width, buckets),
            lines,
        })
    }

    /// A per-bucket count as a staircase: flat across each bucket.
    fn stairs<'a>(&'a self, counts: &'a [u64]) -> impl Iterator<Item = (f64, f64)> + 'a {
        counts.iter().enumerate().flat_map(|(k, &c)| [(self.edges[k], c as f64), (self.edges[k + 1], c as f64)])
    }

    /// Trailing-window counts at each bucket's end, starting from zero at time zero.
    fn trailing<'a>(&'a self, counts: &'a [u64]) -> impl Iterator<Item = (f64, f64)> + 'a {
        std::iter::once((0.0, 0.0)).chain(counts.iter().enumerate().map(|(k, &c)| (self.edges[k + 1], c as f64)))
    }
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn y_range(max: u64) -> Range<f64> {
    0.0..(max.max(1) as f64 * 1.12)
}

/// Width of the legend column at the right of both panels.
const LEGEND_WIDTH: i32 = 260;

/// One legend entry: a line sample (with a dot when `dot`) and its text.
struct Entry {
    color: RGBColor,
    stroke: u32,
    dot: bool,
    dashed: bool,
    text: String,
}

/// Draws entries top-down in `area` (a column beside a panel), aligned with the panel's plot.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[Entry],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let font = (FONT, 12).into_font().color(&BLACK);
    for (i, e) in entries.iter().enumerate() {
        let y = 48 + 20 * i as i32;
        let style = e.color.stroke_width(e.stroke);
        if e.dashed {
            area.draw(&PathElement::new(vec![(8, y), (14, y)], style))?;
            area.draw(&PathElement::new(vec![(20, y), (30, y)], style))?;
        } else {
            area.draw(&PathElement::new(vec![(8, y), (30, y)], style))?;
        }
        if e.dot {
            area.draw(&Circle::new((30, y), 4, e.color.filled()))?;
        }
        area.draw(&Text::new(e.text.clone(), (40, y - 7), font.clone()))?;
    }
    Ok(())
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    p: &PlotData,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let area = root.titled(&p.title, (FONT, 20))?;
    let (charts, legends) = area.split_horizontally(area.dim_in_pixel().0 as i32 - LEGEND_WIDTH);
    let half = area.dim_in_pixel().1 as i32 / 2;
    let (upper, lower) = charts.split_vertically(half);
    let (upper_legend, lower_legend) = legends.split_vertically(half);
    let count_label = |v: &f64| format!("{v:.0}");

    // Top: offered vs admitted per bucket.
    let top = p.lines.iter().flat_map(|l| l.per_bucket.iter()).chain(&p.offered).copied().max().unwrap_or(0);
    let mut chart = ChartBuilder::on(&upper)
        .caption(format!("offered vs admitted, requests per {} bucket", Span(p.bucket)), (FONT, 15))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..p.end_s, y_range(top))?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(BLACK.mix(0.08))
        .x_desc("time (s)")
        .y_desc(format!("requests per {}", Span(p.bucket)))
        .y_label_formatter(&count_label)
        .label_style((FONT, 12))
        .draw()?;
    chart.draw_series(LineSeries::new(p.stairs(&p.offered), OFFERED.stroke_width(3)))?;
    let mut entries = vec![Entry { color: OFFERED, stroke: 3, dot: false, dashed: false, text: "offered".into() }];
    for line in &p.lines {
        let c = color(line.kind);
        chart.draw_series(LineSeries::new(p.stairs(&line.per_bucket), c.stroke_width(1)))?;
        entries.push(Entry { color: c, stroke: 2, dot: false, dashed: false, text: line.kind.name().into() });
    }
    legend(&upper_legend, &entries)?;

    // Bottom: admitted in the trailing period vs the limit, worst windows marked.
    let top = p.lines.iter().flat_map(|l| l.trailing.iter().copied().chain([l.worst.count])).max().unwrap_or(0);
    let mut chart = ChartBuilder::on(&lower)
        .caption(
            format!("admitted in the trailing {} vs the limit; thick segment = worst window", Span(p.period)),
            (FONT, 15),
        )
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..p.end_s, y_range(top.max(p.limit)))?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(BLACK.mix(0.08))
        .x_desc("time (s)")
        .y_desc(format!("admitted per {}", Span(p.period)))
        .y_label_formatter(&count_label)
        .label_style((FONT, 12))
        .draw()?;
    let limit = p.limit as f64;
    chart.draw_series(DashedLineSeries::new([(0.0, limit), (p.end_s, limit)], 10, 6, BLACK.stroke_width(2)))?;
    let mut entries =
        vec![Entry { color: BLACK, stroke: 2, dot: false, dashed: true, text: format!("limit {}", p.limit) }];
    let period_s = p.period.as_secs_f64();
    for line in &p.lines {
        let c = color(line.kind);
        chart.draw_series(LineSeries::new(p.trailing(&line.trailing), c.stroke_width(2)))?;
        if line.worst.count > 0 {
            let start = secs(line.worst.start_ns).min(p.end_s);
            let stop = (start + period_s).min(p.end_s);
            let y = line.worst.count as f64;
            chart.draw_series([PathElement::new(vec![(start, y), (stop, y)], c.stroke_width(4))])?;
            chart.draw_series([Circle::new((stop, y), 5, c.filled())])?;
        }
        let text = format!("{} {}/{}", line.kind.name(), line.worst.count, p.limit);
        entries.push(Entry { color: c, stroke: 4, dot: true, dashed: false, text });
    }
    legend(&lower_legend, &entries)?;
    root.present()
}
