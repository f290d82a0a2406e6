//! Workload types (OServe §5.1): k-means over (input, output) token
//! lengths. Lengths span four orders of magnitude, so points are clustered
//! in `ln(1 + tokens)` space, where a short and a long request differ by
//! the same distance whatever the absolute scale. Deterministic: k-means++
//! seeding from a [`SplitMix`] seed, Lloyd iterations until no point moves
//! (bounded), centroids sorted by the input's power of two and then the
//! output, so type ids stay put across refits of similar traffic.

use crate::rng::SplitMix;

/// Most Lloyd iterations of one fit.
pub const MAX_ITERATIONS: usize = 100;

/// Types as their centroids, in tokens (input, output).
#[derive(Debug, Clone, PartialEq)]
pub struct Types {
    pub centroids: Vec<(f64, f64)>,
}

fn point(input: f64, output: f64) -> [f64; 2] {
    [input.max(0.0).ln_1p(), output.max(0.0).ln_1p()]
}

fn dist2(a: [f64; 2], b: [f64; 2]) -> f64 {
    (a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2)
}

/// The index of the centre nearest to `p` (the first of equals; 0 for none).
fn nearest(centres: impl Iterator<Item = [f64; 2]>, p: [f64; 2]) -> usize {
    centres.map(|c| dist2(c, p)).enumerate().min_by(|a, b| a.1.total_cmp(&b.1)).map_or(0, |(j, _)| j)
}

/// The index of the centroid (input, output tokens) nearest to a request
/// of `input` tokens expected to produce `output`, in the fit's log space;
/// 0 without centroids. Allocates nothing: admission calls it per request.
pub fn nearest_centroid(centroids: impl Iterator<Item = (f64, f64)>, input: f64, output: f64) -> usize {
    nearest(centroids.map(|(i, o)| point(i, o)), point(input, output))
}

/// k-means++ seeding: the first centre uniformly, each next one with
/// probability proportional to the squared distance to the nearest chosen.
fn seed_centres(pts: &[[f64; 2]], k: usize, rng: &mut SplitMix) -> Vec<[f64; 2]> {
    let mut centres = vec![pts[(rng.next_u64() % pts.len() as u64) as usize]];
    while centres.len() < k {
        let d: Vec<f64> =
            pts.iter().map(|&p| dist2(centres[nearest(centres.iter().copied(), p)], p)).collect();
        let total: f64 = d.iter().sum();
        if total <= 0.0 {
            break;
        }
        let mut pick = rng.unit_f64() * total;
        let mut chosen = pts.len() - 1;
        for (i, di) in d.iter().enumerate() {
            if pick < *di {
                chosen = i;
                break;
            }
            pick -= di;
        }
        centres.push(pts[chosen]);
    }
    centres
}

impl Types {
    /// Fits `k` types to `samples` of (input, output) tokens. Fewer distinct
    /// points than `k` give fewer types; no samples give none.
    pub fn fit(samples: &[(f64, f64)], k: usize, seed: u64) -> Types {
        let pts: Vec<[f64; 2]> = samples.iter().map(|&(i, o)| point(i, o)).collect();
        let mut distinct = pts.clone();
        distinct.sort_by(|a, b| a[0].total_cmp(&b[0]).then(a[1].total_cmp(&b[1])));
        distinct.dedup();
        let k = k.min(distinct.len());
        if k == 0 {
            return Types { centroids: Vec::new() };
        }
        let mut centres = seed_centres(&pts, k, &mut SplitMix(seed));
        let mut owner = vec![usize::MAX; pts.len()];
        for _ in 0..MAX_ITERATIONS {
            let mut moved = false;
            for (o, &p) in owner.iter_mut().zip(&pts) {
                let n = nearest(centres.iter().copied(), p);
                moved |= *o != n;
                *o = n;
            }
            if !moved {
                break;
            }
            for (c, centre) in centres.iter_mut().enumerate() {
                let mine: Vec<[f64; 2]> =
                    pts.iter().zip(&owner).filter(|(_, &o)| o == c).map(|(p, _)| *p).collect();
                if !mine.is_empty() {
                    let n = mine.len() as f64;
                    *centre = [
                        mine.iter().map(|p| p[0]).sum::<f64>() / n,
                        mine.iter().map(|p| p[1]).sum::<f64>() / n,
                    ];
                }
            }
        }
        let mut centroids: Vec<(f64, f64)> = centres.iter().map(|c| (c[0].exp_m1(), c[1].exp_m1())).collect();
        // Stable ids: by the input's power of two, then by output.
        let octave = |tokens: f64| (1.0 + tokens).log2().floor();
        centroids.sort_by(|a, b| octave(a.0).total_cmp(&octave(b.0)).then(a.1.total_cmp(&b.1)));
        Types { centroids }
    }

    /// The type of a request of `input` tokens expected to produce `output`.
    pub fn classify(&self, input: f64, output: f64) -> usize {
        nearest_centroid(self.centroids.iter().copied(), input, output)
    }

    pub fn len(&self) -> usize {
        self.centroids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.centroids.is_empty()
    }
}
