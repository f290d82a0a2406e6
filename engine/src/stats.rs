//! Small statistics shared by the engine's measuring tools.

/// The median of timing samples (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
