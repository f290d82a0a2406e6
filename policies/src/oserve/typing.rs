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

fn nearest(centres: &[[f64; 2]], p: [f64; 2]) -> usize {
    (0..centres.len()).min_by(|&a, &b| dist2(centres[a], p).total_cmp(&dist2(centres[b], p))).unwrap_or(0)
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
        let mut rng = SplitMix(seed);
        // k-means++: the first centre uniformly, each next one with
        // probability proportional to the squared distance to the nearest.
        let mut centres = vec![pts[(rng.next_u64() % pts.len() as u64) as usize]];
        while centres.len() < k {
            let d: Vec<f64> = pts.iter().map(|&p| dist2(centres[nearest(&centres, p)], p)).collect();
            let total: f64 = d.iter().sum();
            let mut pick = rng.unit_f64() * total;
            let mut chosen = pts.len() - 1;
            for (i, di) in d.iter().enumerate() {
                if pick < *di {
                    chosen = i;
                    break;
                }
                pick -= di;
            }
            if total <= 0.0 {
                break;
            }
            centres.push(pts[chosen]);
        }
        let mut owner = vec![usize::MAX; pts.len()];
        for _ in 0..MAX_ITERATIONS {
            let mut moved = false;
            for (o, &p) in owner.iter_mut().zip(&pts) {
                let n = nearest(&centres, p);
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
        let centres: Vec<[f64; 2]> = self.centroids.iter().map(|&(i, o)| point(i, o)).collect();
        nearest(&centres, point(input, output))
    }

    pub fn len(&self) -> usize {
        self.centroids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.centroids.is_empty()
    }
}
