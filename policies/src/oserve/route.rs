//! Type-aware routing (OServe §4.2, live): the lower level's assignment
//! `x_kj` turned into each workload type's shares over engine classes
//! (configurations), and a smooth weighted round robin that sends a type's
//! requests to classes in those shares.
//!
//! Replicas of one configuration are interchangeable (the cost model gives
//! them the same `n_kj`), so the shares are summed per class and the
//! replica within the class is left to the caller's load-aware choice
//! (admission's predicted finish in the gateway, least in-flight tokens in
//! the simulator). The round robin is deterministic (no random draw): over
//! any window of `W` requests of a type, class `c` gets within one of
//! `W · share_c` ("smooth" weighted round robin, as nginx's upstreams).
//!
//! The assignment is the one that carries the most of the mix, so the
//! shares pay near capacity; below it they only restrict where a request
//! may go, and pooling every replica wins: in the request-level simulator
//! (docs/benchmarks/oserve.md, "OServe at the request level") following the shares
//! at 60-80% load gave P99 E2E 0.97-1.04x of static where least-loaded
//! placement on the same deployments gave 1.10-1.13x. [`type_routing`]
//! turns the routes on only above a utilization (`[oserve]
//! route_above_utilization`, 0.9).

use super::assign::Assignment;

/// Whether requests follow the types' shares: the forecast arrival rate
/// `forecast` (requests/s) is at least `above` × `capacity`, the rate the
/// serving deployment sustains in the forecast mix. `above` 0: always.
pub fn type_routing(forecast: f64, capacity: f64, above: f64) -> bool {
    forecast >= above * capacity
}

/// Each type's shares over classes, and the round robin's state.
#[derive(Debug, Clone, PartialEq)]
pub struct Routes {
    /// Class names (engine classes), in the order of the shares.
    pub classes: Vec<String>,
    /// `shares[j][c]`: type `j`'s share for class `c` (sums to 1, or all
    /// zero when the type is assigned nowhere).
    pub shares: Vec<Vec<f64>>,
    /// The round robin's running credit per type and class.
    credit: Vec<Vec<f64>>,
}

impl Routes {
    /// Shares from `a` (replica `k` of class `class_of[k]`, `classes.len()`
    /// classes, `types` types).
    pub fn from_assignment(classes: Vec<String>, class_of: &[usize], types: usize, a: &Assignment) -> Routes {
        let mut shares = vec![vec![0.0; classes.len()]; types];
        for (k, row) in a.x.iter().enumerate() {
            let Some(&c) = class_of.get(k) else { continue };
            for (j, &x) in row.iter().enumerate().take(types) {
                if c < classes.len() && x > 0.0 {
                    shares[j][c] += x;
                }
            }
        }
        for row in &mut shares {
            let total: f64 = row.iter().sum();
            if total > 0.0 {
                row.iter_mut().for_each(|v| *v /= total);
            }
        }
        let credit = vec![vec![0.0; classes.len()]; types];
        Routes { classes, shares, credit }
    }

    /// The class for the next request of type `j`, among the classes for
    /// which `available` holds (those with a ready engine): the smooth
    /// weighted round robin over the type's shares renormalised to them.
    /// `None` when the type has no share on any available class (the
    /// caller routes as without OServe).
    pub fn pick(&mut self, j: usize, available: impl Fn(usize) -> bool) -> Option<usize> {
        let shares = self.shares.get(j)?;
        let credit = self.credit.get_mut(j)?;
        let open: Vec<usize> = (0..shares.len()).filter(|&c| shares[c] > 0.0 && available(c)).collect();
        let total: f64 = open.iter().map(|&c| shares[c]).sum();
        if total <= 0.0 {
            return None;
        }
        for &c in &open {
            credit[c] += shares[c] / total;
        }
        let best = open.iter().copied().max_by(|&a, &b| credit[a].total_cmp(&credit[b]).then(b.cmp(&a)))?;
        credit[best] -= 1.0;
        Some(best)
    }

    /// Class index of `name`.
    pub fn class_index(&self, name: &str) -> Option<usize> {
        self.classes.iter().position(|c| c == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(x: Vec<Vec<f64>>, class_of: &[usize], classes: usize) -> Routes {
        let types = x.first().map_or(0, Vec::len);
        let a = Assignment { served: x.iter().flatten().sum(), load: vec![0.0; x.len()], x };
        Routes::from_assignment((0..classes).map(|c| format!("c{c}")).collect(), class_of, types, &a)
    }

    #[test]
    fn types_are_routed_only_near_capacity_unless_always() {
        assert!(!type_routing(8.0, 10.0, 0.9), "80% of capacity: pooled");
        assert!(type_routing(9.0, 10.0, 0.9));
        assert!(type_routing(12.0, 10.0, 0.9), "over capacity");
        assert!(type_routing(0.1, 10.0, 0.0), "0: always, as the paper");
    }

    #[test]
    fn shares_sum_replicas_of_a_class_and_normalise_per_type() {
        // Replicas 0 and 1 are class 0, replica 2 class 1; type 1 unassigned.
        let r = routes(vec![vec![2.0, 0.0], vec![1.0, 0.0], vec![1.0, 0.0]], &[0, 0, 1], 2);
        assert_eq!(r.shares[0], vec![0.75, 0.25]);
        assert_eq!(r.shares[1], vec![0.0, 0.0]);
    }

    #[test]
    fn the_round_robin_keeps_every_window_within_one_request_of_the_shares() {
        let mut r = routes(vec![vec![5.0], vec![3.0], vec![2.0]], &[0, 1, 2], 3);
        let mut counts = [0usize; 3];
        for n in 1..=200 {
            let c = r.pick(0, |_| true).unwrap();
            counts[c] += 1;
            for (c, &got) in counts.iter().enumerate() {
                let want = n as f64 * r.shares[0][c];
                assert!(
                    (got as f64 - want).abs() <= 1.0 + 1e-9,
                    "after {n}: class {c} got {got}, want {want}"
                );
            }
        }
        assert_eq!(counts, [100, 60, 40]);
    }

    #[test]
    fn unavailable_classes_pass_their_share_to_the_others_and_no_share_is_none() {
        let mut r = routes(vec![vec![1.0, 0.0], vec![1.0, 0.0], vec![0.0, 0.0]], &[0, 1, 2], 3);
        for _ in 0..10 {
            assert_eq!(r.pick(0, |c| c != 0), Some(1), "class 0 has no ready engine");
        }
        assert_eq!(r.pick(0, |c| c == 2), None, "type 0 has no share on class 2");
        assert_eq!(r.pick(1, |_| true), None, "type 1 is assigned nowhere");
        assert_eq!(r.pick(7, |_| true), None, "unknown type");
    }
}
