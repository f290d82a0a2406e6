//! The lower level of OServe (§4.2): which replica serves how many requests
//! of each type.
//!
//! The flow network: source → type node `w_j` (capacity `λ_j`, C1) →
//! `i_kj` → replica in-node `c_k^in` (capacity `e_kj`, C2) → `c_k^out`
//! (the replica's shared capacity, C3) → sink. A type-`j` request takes
//! `1 / n_kj` of replica `k`'s capacity (the paper's `M_k / n_kj` units of
//! `M_k = lcm_j n_kj`; dividing by `M_k` gives the same constraint without
//! requiring integer capacities). Because a unit of flow costs a different
//! share of the replica per type, C3 makes this a generalised flow, which a
//! plain max-flow does not solve exactly; it is a small linear program
//! (`K·J` variables), solved here exactly by the simplex method (Bland's
//! rule: no cycling), which is the "other exact algorithm" the issue allows
//! in place of preflow-push. Tests check it against brute-force vertex
//! enumeration and that no assignment breaks C1-C3.

/// One replica's capacities per type, in requests per planning interval:
/// `n[j]` what it serves of type `j` alone (0: it cannot serve `j`), `e[j]`
/// the most of type `j` it may be given (C2; `f64::INFINITY` for none).
#[derive(Debug, Clone, PartialEq)]
pub struct Replica {
    pub n: Vec<f64>,
    pub e: Vec<f64>,
}

/// The assignment `x[k][j]` and what it achieves.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    pub x: Vec<Vec<f64>>,
    /// Requests served: `Σ x`.
    pub served: f64,
    /// Each replica's share of its capacity in use (`Σ_j x_kj / n_kj`, at
    /// most 1): 1 is a bottleneck, low values are under-used (the upper
    /// level's signal).
    pub load: Vec<f64>,
}

impl Assignment {
    /// Requests of type `j` left unserved.
    pub fn unserved(&self, lambda: &[f64], j: usize) -> f64 {
        (lambda[j] - self.x.iter().map(|row| row[j]).sum::<f64>()).max(0.0)
    }

    /// Routing weights for type `j`: each replica's share of the type's
    /// assigned requests (all zero when none is assigned).
    pub fn weights(&self, j: usize) -> Vec<f64> {
        let total: f64 = self.x.iter().map(|row| row[j]).sum();
        self.x.iter().map(|row| if total > 0.0 { row[j] / total } else { 0.0 }).collect()
    }
}

const EPS: f64 = 1e-9;
/// Most simplex pivots (Bland's rule terminates; this bounds a bug).
const MAX_PIVOTS: usize = 100_000;

/// The assignment serving the most requests of `lambda` (per type) on
/// `replicas`. Types a replica cannot serve (`n = 0`) get none there.
pub fn assign(lambda: &[f64], replicas: &[Replica]) -> Assignment {
    let types = lambda.len();
    // Variables: x_kj for pairs the replica can serve.
    let vars: Vec<(usize, usize)> = (0..replicas.len())
        .flat_map(|k| (0..types).map(move |j| (k, j)))
        .filter(|&(k, j)| replicas[k].n.get(j).copied().unwrap_or(0.0) > 0.0 && lambda[j] > 0.0)
        .collect();
    // Rows a·x ≤ b with b ≥ 0 (the origin is feasible: no phase one).
    let mut rows: Vec<(Vec<f64>, f64)> = Vec::new();
    for (j, &l) in lambda.iter().enumerate() {
        rows.push((vars.iter().map(|&(_, vj)| f64::from(u8::from(vj == j))).collect(), l.max(0.0)));
    }
    for (v, &(k, j)) in vars.iter().enumerate() {
        let e = replicas[k].e.get(j).copied().unwrap_or(f64::INFINITY);
        if e.is_finite() {
            let mut a = vec![0.0; vars.len()];
            a[v] = 1.0;
            rows.push((a, e.max(0.0)));
        }
    }
    for (k, r) in replicas.iter().enumerate() {
        let a = vars.iter().map(|&(vk, vj)| if vk == k { 1.0 / r.n[vj] } else { 0.0 }).collect();
        rows.push((a, 1.0));
    }
    let values = simplex_max(&vec![1.0; vars.len()], &rows);
    let mut x = vec![vec![0.0; types]; replicas.len()];
    for (&(k, j), v) in vars.iter().zip(values) {
        x[k][j] = v;
    }
    let load = (replicas.iter().zip(&x))
        .map(|(r, row)| row.iter().enumerate().filter(|(j, _)| r.n[*j] > 0.0).map(|(j, v)| v / r.n[j]).sum())
        .collect();
    Assignment { served: x.iter().flatten().sum(), x, load }
}

/// Maximises `c·x` subject to `a·x ≤ b` (every `b ≥ 0`) and `x ≥ 0` with a
/// dense tableau; returns `x`.
pub(crate) fn simplex_max(c: &[f64], rows: &[(Vec<f64>, f64)]) -> Vec<f64> {
    let (n, m) = (c.len(), rows.len());
    // Tableau: m constraint rows [a | slack identity | b], then the
    // objective row [-c | 0 | 0]. Column n + i is row i's slack.
    let width = n + m + 1;
    let mut t = vec![vec![0.0; width]; m + 1];
    for (i, (a, b)) in rows.iter().enumerate() {
        t[i][..n].copy_from_slice(a);
        t[i][n + i] = 1.0;
        t[i][width - 1] = *b;
    }
    for (j, cj) in c.iter().enumerate() {
        t[m][j] = -cj;
    }
    let mut basis: Vec<usize> = (n..n + m).collect();
    for _ in 0..MAX_PIVOTS {
        // Bland: the lowest-index column with a negative reduced cost.
        let Some(col) = (0..width - 1).find(|&j| t[m][j] < -EPS) else { break };
        // Ratio test, ties to the lowest basis index.
        let mut pick: Option<(usize, f64)> = None;
        for (i, row) in t.iter().enumerate().take(m) {
            if row[col] > EPS {
                let ratio = row[width - 1] / row[col];
                let better = match pick {
                    None => true,
                    Some((p, r)) => ratio < r - EPS || (ratio <= r + EPS && basis[i] < basis[p]),
                };
                if better {
                    pick = Some((i, ratio));
                }
            }
        }
        // Unbounded cannot happen here (every variable is capped by C3).
        let Some((row, _)) = pick else { break };
        let p = t[row][col];
        t[row].iter_mut().for_each(|v| *v /= p);
        let pivot = t[row].clone();
        for (i, r) in t.iter_mut().enumerate() {
            if i != row && r[col].abs() > EPS {
                let f = r[col];
                r.iter_mut().zip(&pivot).for_each(|(v, pv)| *v -= f * pv);
            }
        }
        basis[row] = col;
    }
    let mut x = vec![0.0; n];
    for (i, &b) in basis.iter().enumerate() {
        if b < n {
            x[b] = t[i][width - 1].max(0.0);
        }
    }
    x
}
