use super::assign::{assign, Replica};
use super::typing::Types;
use crate::rng::SplitMix;

fn replica(n: &[f64]) -> Replica {
    Replica { n: n.to_vec(), e: vec![f64::INFINITY; n.len()] }
}

/// Checks C1-C3 and `x ≥ 0` for an assignment.
fn feasible(lambda: &[f64], replicas: &[Replica], x: &[Vec<f64>]) {
    let tol = 1e-6;
    for (j, l) in lambda.iter().enumerate() {
        let sum: f64 = x.iter().map(|row| row[j]).sum();
        assert!(sum <= l + tol, "C1: type {j} gets {sum} of {l}");
    }
    for (k, (r, row)) in replicas.iter().zip(x).enumerate() {
        let mut share = 0.0;
        for (j, &v) in row.iter().enumerate() {
            assert!(v >= -tol, "x[{k}][{j}] = {v}");
            assert!(v <= r.e[j] + tol, "C2: x[{k}][{j}] = {v} > e = {}", r.e[j]);
            if r.n[j] > 0.0 {
                share += v / r.n[j];
            } else {
                assert!(v <= tol, "replica {k} cannot serve type {j}");
            }
        }
        assert!(share <= 1.0 + tol, "C3: replica {k} at {share}");
    }
}

#[test]
fn the_papers_mixed_replica_serves_the_cheaper_type_first() {
    // 80 type-1 or 50 type-2 requests per interval (LCM 400: 5 and 8 units).
    let r = [replica(&[80.0, 50.0])];
    let a = assign(&[80.0, 50.0], &r);
    assert!((a.served - 80.0).abs() < 1e-9, "{a:?}");
    // With only 40 type-1 requests, half the capacity is left for type 2.
    let a = assign(&[40.0, 50.0], &r);
    assert!((a.x[0][0] - 40.0).abs() < 1e-9 && (a.x[0][1] - 25.0).abs() < 1e-9, "{a:?}");
    assert!((a.load[0] - 1.0).abs() < 1e-9);
}

#[test]
fn specialised_replicas_each_take_the_type_they_are_fast_at() {
    let r = [replica(&[100.0, 10.0]), replica(&[10.0, 100.0])];
    let a = assign(&[100.0, 100.0], &r);
    assert!((a.served - 200.0).abs() < 1e-9, "{a:?}");
    assert!((a.x[0][0] - 100.0).abs() < 1e-9 && (a.x[1][1] - 100.0).abs() < 1e-9);
    assert_eq!(a.weights(0), vec![1.0, 0.0]);
    assert_eq!(a.unserved(&[100.0, 100.0], 1), 0.0);
}

#[test]
fn edge_capacities_and_unservable_types_are_respected() {
    let r = [
        Replica { n: vec![100.0, 0.0], e: vec![30.0, f64::INFINITY] },
        Replica { n: vec![50.0, 50.0], e: vec![f64::INFINITY, 20.0] },
    ];
    let lambda = [100.0, 100.0];
    let a = assign(&lambda, &r);
    feasible(&lambda, &r, &a.x);
    assert_eq!(a.x[0][1], 0.0, "replica 0 cannot serve type 1");
    // Replica 0 gives its 30 (C2); replica 1 takes 20 of type 1 (C2) and
    // fills the rest of its capacity with type 0: 30 + 20 + 30.
    assert!((a.served - 80.0).abs() < 1e-9, "{a:?}");
}

/// The LP optimum by enumerating every vertex: each choice of `vars`
/// constraints held with equality, solved, kept if feasible.
fn brute_force(lambda: &[f64], replicas: &[Replica]) -> f64 {
    let types = lambda.len();
    let vars: Vec<(usize, usize)> =
        (0..replicas.len()).flat_map(|k| (0..types).map(move |j| (k, j))).collect();
    let n = vars.len();
    let mut cons: Vec<(Vec<f64>, f64)> = Vec::new();
    for (j, &l) in lambda.iter().enumerate() {
        cons.push((vars.iter().map(|&(_, vj)| f64::from(u8::from(vj == j))).collect(), l));
    }
    for (v, &(k, j)) in vars.iter().enumerate() {
        let mut a = vec![0.0; n];
        a[v] = 1.0;
        cons.push((a.clone(), replicas[k].e[j]));
        cons.push((a.iter().map(|x| -x).collect(), 0.0));
    }
    for (k, r) in replicas.iter().enumerate() {
        cons.push((vars.iter().map(|&(vk, vj)| if vk == k { 1.0 / r.n[vj] } else { 0.0 }).collect(), 1.0));
    }
    let mut best = 0.0f64;
    let mut pick = vec![0usize; n];
    fn next(pick: &mut [usize], m: usize) -> bool {
        let n = pick.len();
        for i in (0..n).rev() {
            if pick[i] < m - n + i {
                pick[i] += 1;
                for j in i + 1..n {
                    pick[j] = pick[j - 1] + 1;
                }
                return true;
            }
        }
        false
    }
    (0..n).for_each(|i| pick[i] = i);
    loop {
        let mut m: Vec<Vec<f64>> =
            pick.iter().map(|&c| cons[c].0.iter().copied().chain([cons[c].1]).collect()).collect();
        if let Some(x) = solve(&mut m) {
            if cons.iter().all(|(a, b)| a.iter().zip(&x).map(|(p, q)| p * q).sum::<f64>() <= b + 1e-7) {
                best = best.max(x.iter().sum());
            }
        }
        if !next(&mut pick, cons.len()) {
            return best;
        }
    }
}

/// Gaussian elimination with partial pivoting on `[A | b]`.
fn solve(m: &mut [Vec<f64>]) -> Option<Vec<f64>> {
    let n = m.len();
    for c in 0..n {
        let p = (c..n).max_by(|&a, &b| m[a][c].abs().total_cmp(&m[b][c].abs()))?;
        if m[p][c].abs() < 1e-12 {
            return None;
        }
        m.swap(c, p);
        let pivot = m[c].clone();
        for (r, row) in m.iter_mut().enumerate() {
            if r != c {
                let f = row[c] / pivot[c];
                row.iter_mut().zip(&pivot).skip(c).for_each(|(v, p)| *v -= f * p);
            }
        }
    }
    Some((0..n).map(|r| m[r][n] / m[r][r]).collect())
}

fn random_case(rng: &mut SplitMix, replicas: usize, types: usize) -> (Vec<f64>, Vec<Replica>) {
    let lambda = (0..types).map(|_| (rng.unit_f64() * 200.0).round()).collect();
    let rs = (0..replicas)
        .map(|_| Replica {
            n: (0..types).map(|_| (10.0 + rng.unit_f64() * 190.0).round()).collect(),
            e: (0..types).map(|_| (rng.unit_f64() * 150.0).round()).collect(),
        })
        .collect();
    (lambda, rs)
}

#[test]
fn the_assignment_is_the_optimum_of_brute_force_vertex_enumeration() {
    let mut rng = SplitMix(25);
    for case in 0..60 {
        let (replicas, types) = [(1, 2), (2, 2), (3, 2), (2, 3)][case % 4];
        let (lambda, rs) = random_case(&mut rng, replicas, types);
        let a = assign(&lambda, &rs);
        feasible(&lambda, &rs, &a.x);
        let want = brute_force(&lambda, &rs);
        assert!((a.served - want).abs() < 1e-6, "case {case}: simplex {} vs brute force {want}", a.served);
    }
}

#[test]
fn no_assignment_breaks_the_capacity_constraints_at_fleet_size() {
    let mut rng = SplitMix(7);
    for _ in 0..50 {
        let (lambda, rs) = random_case(&mut rng, 16, 4);
        let a = assign(&lambda, &rs);
        feasible(&lambda, &rs, &a.x);
        for (k, r) in rs.iter().enumerate() {
            let share: f64 = (0..4).map(|j| a.x[k][j] / r.n[j]).sum();
            assert!((share - a.load[k]).abs() < 1e-9);
        }
    }
}

/// Four well-separated groups of (input, output) tokens.
fn four_groups(rng: &mut SplitMix) -> Vec<(f64, f64)> {
    let centres = [(100.0, 50.0), (100.0, 1500.0), (4000.0, 60.0), (4000.0, 1200.0)];
    (0..400)
        .map(|i| {
            let (a, b) = centres[i % 4];
            (a * (1.0 + 0.2 * (rng.unit_f64() - 0.5)), b * (1.0 + 0.2 * (rng.unit_f64() - 0.5)))
        })
        .collect()
}

#[test]
fn kmeans_types_are_deterministic_and_find_the_groups() {
    let samples = four_groups(&mut SplitMix(1));
    let t = Types::fit(&samples, 4, 42);
    assert_eq!(t, Types::fit(&samples, 4, 42), "same samples and seed, same types");
    assert_eq!(t.len(), 4);
    // Sorted by input octave, then output: SISO, SILO, LISO, LILO.
    let want = [(100.0, 50.0), (100.0, 1500.0), (4000.0, 60.0), (4000.0, 1200.0)];
    for ((ci, co), (wi, wo)) in t.centroids.iter().zip(want) {
        assert!((ci / wi - 1.0).abs() < 0.1 && (co / wo - 1.0).abs() < 0.1, "{:?}", t.centroids);
    }
    for (i, &(input, output)) in samples.iter().enumerate() {
        assert_eq!(t.classify(input, output), [0, 1, 2, 3][i % 4], "sample {i}");
    }
    // Another seed converges to the same types here.
    assert_eq!(Types::fit(&samples, 4, 7).centroids.len(), 4);
}

#[test]
fn fewer_distinct_points_than_types_give_fewer_types() {
    let t = Types::fit(&[(10.0, 10.0), (10.0, 10.0), (900.0, 5.0)], 4, 1);
    assert_eq!(t.len(), 2);
    assert_eq!(t.classify(12.0, 9.0), 0);
    assert_eq!(t.classify(1000.0, 3.0), 1);
    assert!(Types::fit(&[], 3, 1).is_empty());
}

mod planning {
    use super::super::capacity::{CostModel, Parallel};
    use super::super::deploy::{evaluate, min_gpus, search, Deployment};

    const M: CostModel = CostModel::LLAMA70B_H200;
    const SISO: (f64, f64) = (200.0, 100.0);
    const LILO: (f64, f64) = (6000.0, 1500.0);
    const TP2: Parallel = Parallel { tp: 2, pp: 1 };
    const TP4: Parallel = Parallel { tp: 4, pp: 1 };
    const TP8: Parallel = Parallel { tp: 8, pp: 1 };

    fn per_gpu(p: Parallel, t: (f64, f64)) -> f64 {
        M.capacity(p, t.0, t.1) / f64::from(p.gpus())
    }

    #[test]
    fn short_work_wants_small_replicas_and_long_work_large_ones() {
        assert_eq!(min_gpus(&M), Some(2), "140 GB of weights need two 141 GB GPUs (with KV room)");
        assert!(!M.fits(Parallel { tp: 1, pp: 1 }));
        assert!(per_gpu(TP2, SISO) > per_gpu(TP4, SISO), "{} vs {}", per_gpu(TP2, SISO), per_gpu(TP4, SISO));
        assert!(per_gpu(TP4, LILO) > per_gpu(TP2, LILO), "{} vs {}", per_gpu(TP4, LILO), per_gpu(TP2, LILO));
        // Pipeline stages add KV room without TP's all-reduces.
        assert!(
            M.concurrency(Parallel { tp: 2, pp: 2 }, LILO.0, LILO.1) > M.concurrency(TP2, LILO.0, LILO.1)
        );
    }

    fn served(dep: &[Parallel], lambda: &[f64]) -> f64 {
        evaluate(&M, &Deployment { replicas: dep.to_vec() }, &[SISO, LILO], lambda).served
    }

    #[test]
    fn the_search_beats_every_homogeneous_deployment_on_a_skewed_mix() {
        for lambda in [[60.0, 2.0], [10.0, 6.0], [40.0, 4.0]] {
            let plan = search(&M, 16, &[SISO, LILO], &lambda, 50).unwrap();
            assert_eq!(plan.deployment.gpus(), 16, "{}", plan.deployment);
            if lambda == [40.0, 4.0] {
                // Both types matter: small replicas for the short work,
                // large ones for the long (2 × TP2 + 3 × TP4 here).
                let sizes: std::collections::BTreeSet<u32> =
                    plan.deployment.replicas.iter().map(|p| p.gpus()).collect();
                assert!(sizes.len() > 1, "a mixed deployment: {}", plan.deployment);
            }
            let statics = [vec![TP2; 8], vec![TP4; 4], vec![TP8; 2]];
            for s in &statics {
                assert!(
                    plan.assignment.served >= served(s, &lambda) - 1e-6,
                    "{lambda:?}: {} serves {} < {:?} {}",
                    plan.deployment,
                    plan.assignment.served,
                    s,
                    served(s, &lambda)
                );
            }
        }
    }
}

mod bound {
    use super::super::capacity::{CostModel, Parallel};
    use super::super::deploy::{mix_capacity, search_mix, Deployment};
    use super::SplitMix;

    const TYPES: [(f64, f64); 4] = [(200.0, 100.0), (200.0, 1500.0), (6000.0, 100.0), (6000.0, 1500.0)];

    fn per_gpu(m: &CostModel, p: Parallel, t: (f64, f64)) -> f64 {
        m.capacity(p, t.0, t.1) / f64::from(p.gpus())
    }

    #[test]
    fn the_bound_is_the_worst_per_gpu_shortfall_of_the_base() {
        let m = CostModel::LLAMA70B_H200;
        let (tp2, tp4) = (Parallel { tp: 2, pp: 1 }, Parallel { tp: 4, pp: 1 });
        let lilo = (6000.0, 1500.0);
        let best = m.configurations().into_iter().map(|p| per_gpu(&m, p, lilo)).fold(0.0, f64::max);
        assert_eq!(best, per_gpu(&m, tp4, lilo), "TP4 is the best per GPU for long work on H200");
        assert_eq!(m.gain_bound(tp4, &[lilo]), 1.0, "nothing beats the best configuration");
        let expected = per_gpu(&m, tp4, lilo) / per_gpu(&m, tp2, lilo);
        assert!((m.gain_bound(tp2, &[lilo]) - expected).abs() < 1e-12);
        // A configuration that cannot hold a long sequence bounds nothing.
        let h100 = CostModel::LLAMA70B_H100;
        assert_eq!(h100.gain_bound(tp2, &[(20_000.0, 1500.0)]), f64::INFINITY);
    }

    /// A deployment of `gpus` GPUs from random configurations.
    fn random_deployment(m: &CostModel, rng: &mut SplitMix, gpus: u32) -> Deployment {
        let all = m.configurations();
        let mut replicas = Vec::new();
        let mut left = gpus;
        while left > 0 {
            let fit: Vec<Parallel> = all.iter().copied().filter(|p| p.gpus() <= left).collect();
            let Some(&p) = fit.get((rng.next_u64() % fit.len().max(1) as u64) as usize) else { break };
            replicas.push(p);
            left -= p.gpus();
        }
        Deployment { replicas }
    }

    #[test]
    fn no_deployment_beats_the_static_one_by_more_than_the_bound() {
        for m in [CostModel::LLAMA70B_H200, CostModel::LLAMA70B_H100] {
            let mut rng = SplitMix(7);
            for _ in 0..2 {
                let mix: Vec<f64> = (0..TYPES.len()).map(|_| 0.05 + rng.unit_f64()).collect();
                let mut candidates =
                    vec![search_mix(&m, 16, &TYPES, &mix, 10).expect("a replica fits").deployment];
                candidates.extend((0..3).map(|_| random_deployment(&m, &mut rng, 16)));
                for base in m.configurations().into_iter().filter(|p| 16 % p.gpus() == 0) {
                    let fixed = Deployment { replicas: vec![base; (16 / base.gpus()) as usize] };
                    let own = mix_capacity(&m, &fixed, &TYPES, &mix);
                    let bound = m.gain_bound(base, &TYPES);
                    for d in &candidates {
                        let ratio = mix_capacity(&m, d, &TYPES, &mix) / own;
                        assert!(
                            ratio <= bound * (1.0 + 1e-6),
                            "{d} vs {base}: {ratio} > bound {bound} ({mix:?})"
                        );
                    }
                }
            }
        }
    }
}

mod switching {
    use super::super::capacity::{CostModel, Parallel};
    use super::super::deploy::{evaluate, search, switch_plan, Deployment, Step};

    const M: CostModel = CostModel::LLAMA70B_H200;
    const TYPES: [(f64, f64); 2] = [(200.0, 100.0), (6000.0, 1500.0)];

    /// Replays `steps` from `from`: every state stays within `gpus` and
    /// serves at least `floor` of `need`; returns the end state.
    fn replay(from: &Deployment, steps: &[Step], gpus: u32, need: &[f64], floor: f64) -> Deployment {
        let mut d = from.clone();
        for (i, s) in steps.iter().enumerate() {
            match *s {
                Step::Start(p) => d.replicas.push(p),
                Step::Drain(p) => {
                    let at = d.replicas.iter().position(|&r| r == p).expect("drains a running replica");
                    d.replicas.remove(at);
                }
            }
            assert!(d.gpus() <= gpus, "step {i}: {} GPUs", d.gpus());
            let served = evaluate(&M, &d, &TYPES, need).served;
            assert!(served >= floor - 1e-6, "step {i} ({s:?}): serves {served} < {floor}");
        }
        d.replicas.sort();
        d
    }

    #[test]
    fn switches_between_planned_deployments_never_dip_below_the_forecast() {
        let mixes = [[60.0, 2.0], [10.0, 6.0], [40.0, 4.0], [20.0, 1.0], [30.0, 3.0]];
        let mut planned = 0;
        for from in mixes {
            for to in mixes {
                let a = search(&M, 16, &TYPES, &from, 50).unwrap().deployment;
                let b = search(&M, 16, &TYPES, &to, 50).unwrap().deployment;
                // The forecast: `to`'s mix at 60% of what `a` can serve of it.
                let scale = 0.6 * evaluate(&M, &a, &TYPES, &to).served / to.iter().sum::<f64>();
                let need: Vec<f64> = to.iter().map(|x| x * scale).collect();
                let floor = need.iter().sum::<f64>().min(evaluate(&M, &a, &TYPES, &need).served);
                if let Some(steps) = switch_plan(&M, 16, &a, &b, &TYPES, &need) {
                    let mut want = b.replicas.clone();
                    want.sort();
                    assert_eq!(replay(&a, &steps, 16, &need, floor).replicas, want, "{from:?} -> {to:?}");
                    planned += 1;
                }
            }
        }
        assert!(planned >= 20, "most switches at 60% load have a safe order: {planned} of 25");
    }

    #[test]
    fn a_switch_that_would_dip_is_refused() {
        let tp2 = Parallel { tp: 2, pp: 1 };
        let tp4 = Parallel { tp: 4, pp: 1 };
        let from = Deployment { replicas: vec![tp2; 8] };
        let to = Deployment { replicas: vec![tp4; 4] };
        // Short work: 120 requests/s. Eight TP2 replicas serve 141.7 of it,
        // four TP4 128.6. With no free GPU the second drain would leave
        // 6 × 17.7 = 106 < 120: refused.
        let need = [120.0, 0.0];
        assert_eq!(switch_plan(&M, 16, &from, &to, &TYPES, &need), None);
        // With 8 spare GPUs, two TP4 replicas start first and cover the drains.
        let steps = switch_plan(&M, 24, &from, &to, &TYPES, &need).expect("spare GPUs make room");
        assert_eq!(steps[..2], [Step::Start(tp4), Step::Start(tp4)]);
        let floor = evaluate(&M, &from, &TYPES, &need).served;
        let mut want = to.replicas.clone();
        want.sort();
        assert_eq!(replay(&from, &steps, 24, &need, floor).replicas, want);
        assert_eq!(steps.len(), 4 + 8);
    }
}

#[test]
fn mix_capacity_is_the_rate_at_which_every_type_is_served_in_proportion() {
    use super::capacity::{CostModel, Parallel};
    use super::deploy::{evaluate, mix_capacity, Deployment};
    let m = CostModel::LLAMA70B_H200;
    let types = [(200.0, 100.0), (6000.0, 1500.0)];
    let tp2 = Parallel { tp: 2, pp: 1 };
    let one = Deployment { replicas: vec![tp2] };
    // One type alone: its n.
    let n = m.capacity(tp2, 200.0, 100.0);
    assert!((mix_capacity(&m, &one, &types, &[1.0, 0.0]) - n).abs() < 1e-6 * n);
    // Half and half on one replica: 1 / (0.5/n0 + 0.5/n1) (C3 binding).
    let n1 = m.capacity(tp2, 6000.0, 1500.0);
    let want = 1.0 / (0.5 / n + 0.5 / n1);
    let got = mix_capacity(&m, &one, &types, &[1.0, 1.0]);
    assert!((got - want).abs() < 1e-6 * want, "{got} vs {want}");
    // At that rate the lower level serves both types in full.
    let a = evaluate(&m, &one, &types, &[got / 2.0, got / 2.0]);
    assert!((a.served - got).abs() < 1e-6 * got);
}

mod forecasting {
    use super::super::forecast::{gradient_check, moving_average, rrmse, HoltWinters, Lstm, WINDOW};
    use crate::rng::SplitMix;

    #[test]
    fn the_lstm_gradients_match_finite_differences() {
        for seed in [1, 2, 3] {
            let worst = gradient_check(seed);
            assert!(worst < 1e-4, "seed {seed}: relative gradient error {worst}");
        }
    }

    /// A periodic series (period 24) with a trend and noise.
    fn series(n: usize, seed: u64) -> Vec<f64> {
        let mut rng = SplitMix(seed);
        (0..n)
            .map(|t| {
                let t = t as f64;
                100.0 + 40.0 * (t * std::f64::consts::TAU / 24.0).sin() + 0.2 * t + 5.0 * rng.normal()
            })
            .collect()
    }

    #[test]
    fn the_lstm_and_holt_winters_beat_the_moving_average_on_a_periodic_series() {
        let s = series(400, 4);
        let (train, test_from) = (&s[..300], 300);
        let lstm = Lstm::train(train, 30, 9);
        assert_eq!(lstm, Lstm::train(train, 30, 9), "training is deterministic");
        let hw = HoltWinters::fit(train, 24);
        let actual = &s[test_from..];
        let lstm_pred: Vec<f64> = (test_from..s.len()).map(|t| lstm.forecast(&s[..t])).collect();
        let ma_pred: Vec<f64> = (test_from..s.len()).map(|t| moving_average(&s[..t], 5)).collect();
        let hw_all = hw.one_step(&s);
        let hw_pred = &hw_all[test_from - 1..];
        let (e_lstm, e_ma, e_hw) =
            (rrmse(&lstm_pred, actual), rrmse(&ma_pred, actual), rrmse(hw_pred, actual));
        assert!(e_lstm < e_ma, "LSTM {e_lstm:.3} vs moving average {e_ma:.3}");
        assert!(e_hw < e_ma, "Holt-Winters {e_hw:.3} vs moving average {e_ma:.3}");
        assert!(e_lstm < 0.15, "LSTM RRMSE {e_lstm:.3} (noise alone is ~0.04)");
        let _ = WINDOW;
    }
}

#[test]
fn configuration_profiles_parse_and_replay_the_cost_model() {
    use super::capacity::{CostModel, Parallel};
    let m = CostModel::LLAMA70B_H200;
    for p in [Parallel { tp: 2, pp: 1 }, Parallel { tp: 4, pp: 1 }, Parallel { tp: 2, pp: 2 }] {
        let text = m.profile_toml(p, "llama-70b", &format!("emulated-h200-{p}"));
        let prof = crate::LatencyProfile::parse("generated", &text).unwrap();
        // A decode step at batch 32 and 1,000 tokens of context each: the
        // profile's curve plus its context term, against the model.
        let want = m.token_step_s(p, 32.0, 1000.0) * 1e3;
        let got = prof.decode_step_ms(32, 32_000);
        assert!((got - want).abs() / want < 0.02, "{p}: profile {got} ms vs cost model {want} ms");
        let pre = prof.prefill_ms(2048);
        assert!((pre - m.prefill_s(p, 2048.0) * 1e3).abs() < 0.01, "{p}: prefill {pre}");
    }
}

#[test]
fn the_oserve_section_is_bounded_and_checked() {
    use super::{OserveConfig, TypeCentroid, MAX_TYPES};
    let t = |i: usize| TypeCentroid { name: format!("t{i}"), input: 100.0 * i as f64, output: 10.0 };
    let ok = OserveConfig { types: (0..MAX_TYPES).map(t).collect(), ..Default::default() };
    assert!(ok.validate().is_ok());
    let too_many = OserveConfig { types: (0..=MAX_TYPES).map(t).collect(), ..Default::default() };
    assert_eq!(too_many.validate().unwrap_err().0, "oserve.types");
    let twice = OserveConfig { types: vec![t(1), t(1)], ..Default::default() };
    assert_eq!(twice.validate().unwrap_err().0, "oserve.types[1].name");
    let negative = OserveConfig { types: vec![TypeCentroid { output: -1.0, ..t(1) }], ..Default::default() };
    assert_eq!(negative.validate().unwrap_err().0, "oserve.types[0].output");
    assert_eq!(OserveConfig::default().classify(10.0, 10.0), None, "no types, no classification");
}

#[test]
fn planning_settings_are_bounded_and_need_types_and_configurations() {
    use super::{Configuration, OserveConfig, TypeCentroid, MAX_CONFIGURATIONS};
    let c = |i: usize| Configuration {
        class: format!("c{i}"),
        tp: 2,
        pp: 1,
        profile: "p.toml".into(),
        engine_args: vec!["--kv-pages=100".into()],
    };
    let types = vec![TypeCentroid { name: "t".into(), input: 100.0, output: 10.0 }];
    let ok = OserveConfig {
        types: types.clone(),
        plan_interval_s: 10,
        configurations: vec![c(0)],
        ..Default::default()
    };
    assert!(ok.validate().is_ok());
    assert_eq!(ok.configuration("c0").map(|c| c.parallel().gpus()), Some(2));
    let err = |cfg: OserveConfig| cfg.validate().unwrap_err().0;
    let no_configs = OserveConfig { configurations: Vec::new(), ..ok.clone() };
    assert_eq!(err(no_configs), "oserve.plan_interval_s");
    let no_types = OserveConfig { types: Vec::new(), ..ok.clone() };
    assert_eq!(err(no_types), "oserve.plan_interval_s");
    let many = OserveConfig { configurations: (0..=MAX_CONFIGURATIONS).map(c).collect(), ..ok.clone() };
    assert_eq!(err(many), "oserve.configurations");
    let twice = OserveConfig { configurations: vec![c(1), c(1)], ..ok.clone() };
    assert_eq!(err(twice), "oserve.configurations[1].class");
    // TP3 (the paper's OPT-66B replicas) is a configuration; TP9, PP0 and
    // more than 16 GPUs are not.
    let tp3 = OserveConfig { configurations: vec![Configuration { tp: 3, pp: 2, ..c(0) }], ..ok.clone() };
    assert!(tp3.validate().is_ok());
    for (tp, pp) in [(9, 1), (2, 0), (4, 5)] {
        let odd = OserveConfig { configurations: vec![Configuration { tp, pp, ..c(0) }], ..ok.clone() };
        assert_eq!(err(odd), "oserve.configurations[0].tp", "TP{tp}PP{pp}");
    }
    let window = OserveConfig { forecast_intervals: 0, ..ok.clone() };
    assert_eq!(err(window), "oserve.forecast_intervals");
    let search = OserveConfig { search_iterations: 1001, ..ok.clone() };
    assert_eq!(err(search), "oserve.search_iterations");
    let gain = OserveConfig { min_gain: -0.1, ..ok.clone() };
    assert_eq!(err(gain), "oserve.min_gain");
    let above = OserveConfig { route_above_utilization: 10.5, ..ok.clone() };
    assert_eq!(err(above), "oserve.route_above_utilization");
    let flag =
        OserveConfig { configurations: vec![Configuration { engine_args: vec!["rm".into()], ..c(0) }], ..ok };
    assert_eq!(err(flag), "oserve.configurations[0].engine_args");
}

mod paper_deployments {
    use super::super::capacity::{CostModel, Parallel};
    use super::super::deploy::{mix_capacity, search_mix, Deployment};
    use super::SplitMix;

    const TYPES: [(f64, f64); 4] = [(200.0, 100.0), (200.0, 1500.0), (6000.0, 100.0), (6000.0, 1500.0)];
    const OPT: CostModel = CostModel::OPT66B_H100;

    #[test]
    fn pipeline_stages_overlap_a_prefill_batchs_micro_batches() {
        let m = CostModel::LLAMA70B_H200;
        let (tp2, tp2pp2, tp2pp4) =
            (Parallel { tp: 2, pp: 1 }, Parallel { tp: 2, pp: 2 }, Parallel { tp: 2, pp: 4 });
        // Long prompts: compute dominates, so (2·pp − 1) / pp² of it.
        let r2 = m.prefill_s(tp2pp2, 8192.0) / m.prefill_s(tp2, 8192.0);
        let r4 = m.prefill_s(tp2pp4, 8192.0) / m.prefill_s(tp2, 8192.0);
        assert!((0.75..0.76).contains(&r2), "PP2: {r2}");
        assert!((0.4375..0.45).contains(&r4), "PP4: {r4}");
        // One pipeline stage is the unpipelined model.
        let flops = 2.0 * m.params_b * 1e9 * 8192.0 / (2.0 * m.gpu_tflops * 1e12);
        assert!(m.prefill_s(tp2, 8192.0) > flops);
    }

    #[test]
    fn tp_must_divide_the_heads_and_replicas_take_any_gpu_count() {
        let opt6: Vec<Parallel> = OPT.splits(6);
        for p in [Parallel { tp: 3, pp: 2 }, Parallel { tp: 6, pp: 1 }, Parallel { tp: 2, pp: 3 }] {
            assert!(opt6.contains(&p), "OPT-66B on 6 GPUs: {p} in {opt6:?}");
        }
        let llama6 = CostModel::LLAMA70B_H100.splits(6);
        assert!(llama6.iter().all(|p| p.tp != 3 && p.tp != 6), "64 heads: no TP3 or TP6 ({llama6:?})");
        assert!(OPT.configurations().contains(&Parallel { tp: 3, pp: 1 }), "a three-GPU replica");
        assert!(!OPT.fits(Parallel { tp: 1, pp: 1 }), "132 GB of weights need two 80 GB GPUs");
        assert!(OPT.configurations().iter().all(|p| p.gpus() <= 16 && OPT.fits(*p)));
    }

    #[test]
    fn the_search_never_ends_below_the_best_homogeneous_deployment() {
        let mut rng = SplitMix(11);
        for m in [OPT, CostModel::LLAMA70B_H100, CostModel::LLAMA70B_H200] {
            for _ in 0..3 {
                let mix: Vec<f64> = (0..TYPES.len()).map(|_| 0.05 + rng.unit_f64()).collect();
                let plan = search_mix(&m, 16, &TYPES, &mix, 10).expect("a replica fits");
                assert!(plan.deployment.gpus() <= 16);
                for p in m.configurations() {
                    let uniform = Deployment { replicas: vec![p; (16 / p.gpus()) as usize] };
                    let own = mix_capacity(&m, &uniform, &TYPES, &mix);
                    assert!(
                        plan.score >= own * (1.0 - 1e-6),
                        "{} {} < {uniform} {own}",
                        plan.deployment,
                        plan.score
                    );
                }
            }
        }
    }

    /// The paper's Table 3 ordering, where the cost model allows it: as
    /// short work takes over the mix (its compositions S2 → S5), the plan
    /// runs more, smaller replicas (S5: SISO 47%, LISO 37%).
    #[test]
    fn short_heavy_mixes_get_more_replicas_than_long_heavy_ones() {
        let s2 = [0.242, 0.300, 0.178, 0.280];
        let s5 = [0.471, 0.082, 0.366, 0.082];
        let long = search_mix(&OPT, 16, &TYPES, &s2, 50).unwrap().deployment;
        let short = search_mix(&OPT, 16, &TYPES, &s5, 50).unwrap().deployment;
        assert!(short.replicas.len() > long.replicas.len(), "S5 {short} vs S2 {long}");
    }
}
