//! Minimal SVG line charts for the HTML report: axes with ticks, linear or
//! logarithmic x, several named series, optional horizontal reference lines.
//! No scripts and no external assets, so a report is one self-contained file.

use std::fmt::Write;

/// One line on a chart.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    /// Points in data coordinates; `None` y values break the line.
    pub points: Vec<(f64, Option<f64>)>,
}

/// A horizontal dashed line (a target, say).
#[derive(Debug, Clone)]
pub struct Reference {
    pub name: String,
    pub y: f64,
    /// Draw it in the colour of this series (e.g. a tier's budget in the
    /// tier's colour); grey otherwise.
    pub like_series: Option<usize>,
}

/// A chart's content.
#[derive(Debug, Clone, Default)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub series: Vec<Series>,
    pub references: Vec<Reference>,
}

const W: f64 = 640.0;
const H: f64 = 300.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 44.0;
/// Colour-blind-safe palette (Okabe-Ito).
const COLOURS: [&str; 7] = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000"];

/// Escapes text for SVG/HTML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// "Nice" tick values covering [lo, hi].
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| span / s <= 6.0).unwrap_or(10.0 * mag);
    let (k0, k1) = ((lo / step).ceil() as i64, (hi / step + 1e-9).floor() as i64);
    (k0..=k1).map(|k| k as f64 * step).collect()
}

fn label(v: f64) -> String {
    if v != 0.0 && (v.abs() >= 1e5 || v.abs() < 1e-2) {
        format!("{v:.0e}")
    } else if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}").trim_end_matches('0').to_string()
    }
}

impl Chart {
    /// Renders the chart; an empty chart says so instead of drawing axes.
    pub fn render(&self) -> String {
        let xs = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
        let xs: Vec<f64> = xs.filter(|x| x.is_finite() && (!self.log_x || *x > 0.0)).collect();
        let ys: Vec<f64> = self.series.iter().flat_map(|s| s.points.iter().filter_map(|p| p.1)).collect();
        let mut svg = format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" font-family="sans-serif" font-size="11"><text x="{}" y="16" font-size="13" font-weight="bold">{}</text>"#,
            LEFT,
            esc(&self.title)
        );
        if xs.is_empty() || ys.is_empty() {
            let _ = write!(svg, r#"<text x="{}" y="{}">no data</text></svg>"#, W / 2.0 - 20.0, H / 2.0);
            return svg;
        }
        let fx = |v: f64| if self.log_x { v.log10() } else { v };
        let (mut x0, mut x1) = min_max(xs.iter().map(|&x| fx(x)));
        if x1 - x0 < 1e-12 {
            x1 = x0 + 1.0;
        }
        if self.log_x {
            (x0, x1) = (x0.floor(), x1.ceil());
        }
        let refs = self.references.iter().map(|r| r.y);
        let (_, mut y1) = min_max(ys.iter().copied().chain(refs));
        let y0 = 0f64.min(min_max(ys.iter().copied()).0);
        if y1 - y0 < 1e-12 {
            y1 = y0 + 1.0;
        }
        y1 *= 1.05;
        let px = |v: f64| LEFT + (fx(v) - x0) / (x1 - x0) * (W - LEFT - RIGHT);
        let py = |v: f64| H - BOTTOM - (v - y0) / (y1 - y0) * (H - TOP - BOTTOM);
        self.axes(&mut svg, (x0, x1), (y0, y1), &px, &py);
        for (i, s) in self.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let mut d = String::new();
            let mut pen_up = true;
            for &(x, y) in &s.points {
                match y {
                    Some(y) if x.is_finite() && (!self.log_x || x > 0.0) => {
                        let _ = write!(d, "{}{:.1},{:.1}", if pen_up { "M" } else { "L" }, px(x), py(y));
                        pen_up = false;
                    }
                    _ => pen_up = true,
                }
            }
            let _ = write!(svg, r#"<path d="{d}" fill="none" stroke="{colour}" stroke-width="1.6"/>"#);
            legend(&mut svg, i, colour, &s.name, "");
        }
        for (j, r) in self.references.iter().enumerate() {
            let y = py(r.y);
            let colour = r.like_series.map_or("#888", |i| COLOURS[i % COLOURS.len()]);
            let _ = write!(
                svg,
                r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="{colour}" stroke-dasharray="4 3"/>"##,
                W - RIGHT
            );
            legend(&mut svg, self.series.len() + j, colour, &r.name, r#" stroke-dasharray="4 3""#);
        }
        svg.push_str("</svg>");
        svg
    }

    fn axes(
        &self,
        svg: &mut String,
        x: (f64, f64),
        y: (f64, f64),
        px: &dyn Fn(f64) -> f64,
        py: &dyn Fn(f64) -> f64,
    ) {
        let (bottom, right) = (H - BOTTOM, W - RIGHT);
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" stroke="#333"/>"##
        );
        let xticks: Vec<f64> = if self.log_x {
            (x.0 as i32..=x.1 as i32).map(|e| 10f64.powi(e)).collect()
        } else {
            ticks(x.0, x.1)
        };
        for t in xticks {
            let p = px(t);
            let _ = write!(
                svg,
                r##"<line x1="{p:.1}" x2="{p:.1}" y1="{TOP}" y2="{bottom}" stroke="#eee"/><text x="{p:.1}" y="{}" text-anchor="middle">{}</text>"##,
                bottom + 14.0,
                label(t)
            );
        }
        for t in ticks(y.0, y.1) {
            let p = py(t);
            let _ = write!(
                svg,
                r##"<line x1="{LEFT}" x2="{right}" y1="{p:.1}" y2="{p:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT - 4.0,
                p + 4.0,
                label(t)
            );
        }
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(14,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
            (LEFT + right) / 2.0,
            H - 8.0,
            esc(&self.x_label),
            (TOP + bottom) / 2.0,
            esc(&self.y_label)
        );
    }
}

fn legend(svg: &mut String, i: usize, colour: &str, name: &str, dash: &str) {
    let y = TOP + 8.0 + i as f64 * 16.0;
    let x = W - RIGHT + 10.0;
    let _ = write!(
        svg,
        r#"<line x1="{x}" x2="{}" y1="{y}" y2="{y}" stroke="{colour}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
        x + 18.0,
        x + 22.0,
        y + 4.0,
        esc(name)
    );
}

fn min_max(v: impl Iterator<Item = f64>) -> (f64, f64) {
    v.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)))
}

/// Empirical CDF of `samples` as at most `max_points` points (x, fraction ≤ x).
pub fn cdf(samples: &[f64], max_points: usize) -> Vec<(f64, Option<f64>)> {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let step = n.div_ceil(max_points.max(1)).max(1);
    let mut out: Vec<(f64, Option<f64>)> =
        (0..n).step_by(step).map(|i| (v[i], Some((i + 1) as f64 / n as f64))).collect();
    if let Some(&last) = v.last() {
        out.push((last, Some(1.0)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(0.0, 1.0).len(), 6);
        let t = ticks(3.0, 4870.0);
        assert!(t.first().unwrap() >= &3.0 && t.last().unwrap() <= &4870.0 && t.len() >= 4);
    }

    #[test]
    fn charts_escape_names_and_break_lines_at_gaps() {
        let c = Chart {
            title: "a<b".into(),
            series: vec![Series {
                name: "x&y".into(),
                points: vec![(0.0, Some(1.0)), (1.0, None), (2.0, Some(3.0))],
            }],
            ..Chart::default()
        };
        let svg = c.render();
        assert!(svg.contains("a&lt;b") && svg.contains("x&amp;y"));
        assert_eq!(svg.matches('M').count(), 2, "two line pieces: {svg}");
        assert!(Chart::default().render().contains("no data"));
        let c = cdf(&[3.0, 1.0, 2.0], 10);
        assert_eq!(
            c,
            vec![(1.0, Some(1.0 / 3.0)), (2.0, Some(2.0 / 3.0)), (3.0, Some(1.0)), (3.0, Some(1.0))]
        );
    }
}
