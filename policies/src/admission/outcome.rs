//! What admission decides, as values: the request it is asked about, the
//! outcome (start, wait, refuse), what an admitted request got, why a
//! refused one was refused, and the gate's grants. The controller
//! ([`super::controller::Controller`]) produces them; the gateway and the
//! simulator carry them out.

use super::{Degradation, RejectReason};
use crate::Tier;

/// What one request counts against the engine running it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Work {
    /// Prompt plus output budget (routing by in-flight tokens).
    pub tokens: u64,
    pub prompt_tokens: u64,
    /// Expected output tokens.
    pub out_tokens: u64,
}

/// One request as admission sees it.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub tenant: &'a str,
    pub tier: &'a Tier,
    pub model: &'a str,
    pub prompt_tokens: u32,
    /// After the tier's output cap.
    pub max_tokens: u32,
    pub sampling: bool,
    /// Per-request budgets (`x-slo-*-ms`), already clamped to the tier.
    pub ttft_hint_ms: Option<f64>,
    pub e2e_hint_ms: Option<f64>,
    /// Full prefix blocks of the prompt (`policies::prefix`): what a cached
    /// prefix is measured against.
    pub prefix_blocks: u32,
}

/// A step that changed what the request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The brownout level's output cap lowered `max_tokens`.
    BrownoutOutputCap,
    /// Served best-effort: no engine, even idle, meets the tier's SLO.
    SloUnattainable,
    /// A rung of the tier's degradation ladder.
    Ladder(Degradation),
}

impl Step {
    pub fn label(self) -> &'static str {
        match self {
            Step::BrownoutOutputCap => "brownout_output_cap",
            Step::SloUnattainable => "slo_unattainable",
            Step::Ladder(d) => d.label(),
        }
    }
}

/// Why a request is refused: a closed set, each with its wire label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The tenant already has its tier's `max_concurrency` open (429).
    TenantConcurrency,
    /// The prompt exceeds the brownout level's context ceiling.
    BrownoutContext,
    TtftInfeasible,
    E2eInfeasible,
    KvHeadroom,
    NoEngine,
    /// Waited at the gate; at its turn the first token can no longer make it.
    DeadlineUnreachable,
    /// No slot freed before its wait deadline.
    QueueTimeout,
    /// Not even an idle engine meets the SLO (a 4xx, no Retry-After).
    SloUnattainable,
}

impl Reason {
    pub const ALL: [Reason; 9] = [
        Reason::TenantConcurrency,
        Reason::BrownoutContext,
        Reason::TtftInfeasible,
        Reason::E2eInfeasible,
        Reason::KvHeadroom,
        Reason::NoEngine,
        Reason::DeadlineUnreachable,
        Reason::QueueTimeout,
        Reason::SloUnattainable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reason::TenantConcurrency => "tenant_concurrency",
            Reason::BrownoutContext => "brownout_context",
            Reason::TtftInfeasible => RejectReason::TtftInfeasible.label(),
            Reason::E2eInfeasible => RejectReason::E2eInfeasible.label(),
            Reason::KvHeadroom => RejectReason::KvHeadroom.label(),
            Reason::NoEngine => RejectReason::NoEngine.label(),
            Reason::DeadlineUnreachable => "deadline_unreachable",
            Reason::QueueTimeout => "queue_timeout",
            Reason::SloUnattainable => RejectReason::Unattainable.label(),
        }
    }
}

impl From<RejectReason> for Reason {
    fn from(r: RejectReason) -> Self {
        match r {
            RejectReason::TtftInfeasible => Reason::TtftInfeasible,
            RejectReason::E2eInfeasible => Reason::E2eInfeasible,
            RejectReason::KvHeadroom => Reason::KvHeadroom,
            RejectReason::NoEngine => Reason::NoEngine,
            RejectReason::Unattainable => Reason::SloUnattainable,
        }
    }
}

/// A refusal with what its message and headers need.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub reason: Reason,
    pub retry_after_s: u32,
    /// The predicted TTFT it was refused on, when there was one.
    pub predicted_ttft_ms: Option<f64>,
    /// The TTFT budget the request had.
    pub ttft_budget_ms: f64,
    pub e2e_budget_ms: f64,
    /// `tenant_concurrency`: the limit. `brownout_context`: the ceiling.
    /// `e2e_infeasible`: the output floor. Otherwise 0.
    pub limit: u32,
    /// `deadline_unreachable`: milliseconds waited and of prefill.
    pub waited_ms: f64,
    pub prefill_ms: f64,
    pub brownout_level: usize,
}

impl Refusal {
    pub(crate) fn new(reason: Reason, retry_after_s: u32, level: usize) -> Self {
        Self {
            reason,
            retry_after_s,
            predicted_ttft_ms: None,
            ttft_budget_ms: 0.0,
            e2e_budget_ms: 0.0,
            limit: 0,
            waited_ms: 0.0,
            prefill_ms: 0.0,
            brownout_level: level,
        }
    }
}

/// What a first token is compared with to calibrate TTFT predictions: the
/// engine class admission predicted for and its nominal (raw) TTFT.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Nominal {
    pub class: usize,
    pub ttft_ms: f64,
}

/// What an admitted request got.
#[derive(Debug, Clone, PartialEq)]
pub struct Admit {
    /// Empty: admitted as asked; otherwise degraded by these steps.
    pub steps: Vec<Step>,
    /// Admission is off: admitted without a prediction.
    pub unchecked: bool,
    pub predicted_ttft_ms: Option<f64>,
    pub predicted_e2e_ms: Option<f64>,
    /// For calibration, when admission predicted (not with admission off).
    pub nominal: Option<Nominal>,
    pub brownout_level: usize,
    pub max_tokens: u32,
    pub sampling: bool,
    /// Ordering key for the engine queue (lower first), ms on this
    /// controller's clock.
    pub key: f64,
    pub ttft_budget_ms: f64,
    pub e2e_budget_ms: f64,
    pub work: Work,
    /// The request's `[oserve]` workload type (index into the types), as
    /// routing saw it; `None` without types.
    pub work_type: Option<usize>,
    /// It starts by pausing a lower tier's sequence on its engine.
    pub preempts: bool,
}

impl Admit {
    /// `admitted` or `degraded`.
    pub fn decision(&self) -> &'static str {
        if self.steps.is_empty() {
            "admitted"
        } else {
            "degraded"
        }
    }

    /// `slo_feasible`, `preempts_lower_tier`, `admission_off`, or the steps
    /// joined by `+` (then `+preempts_lower_tier` when it also preempts).
    pub fn reason(&self) -> String {
        if self.unchecked {
            "admission_off".into()
        } else if self.steps.is_empty() && self.preempts {
            "preempts_lower_tier".into()
        } else if self.steps.is_empty() {
            "slo_feasible".into()
        } else if self.preempts {
            let mut r = self.steps.iter().map(|s| s.label()).collect::<Vec<_>>().join("+");
            r.push_str("+preempts_lower_tier");
            r
        } else {
            self.steps.iter().map(|s| s.label()).collect::<Vec<_>>().join("+")
        }
    }
}

/// Identifies a request waiting at the gate.
pub type WaiterId = u64;

/// The decision on one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Start on engine `engine` (the caller's index) now.
    Start {
        engine: usize,
        admit: Admit,
    },
    /// Wait at the gate until a [`Grant`] for `id`, at most until
    /// `deadline` (seconds on the controller's clock).
    Wait {
        id: WaiterId,
        deadline: f64,
        admit: Admit,
    },
    /// Admission off and no engine to pick: start anywhere.
    Anywhere {
        admit: Admit,
    },
    Refuse(Refusal),
}

/// A gate decision for one waiter: an engine, or a refusal.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    pub id: WaiterId,
    /// The waiter's work, to count against the engine granted.
    pub work: Work,
    pub result: Result<usize, Refusal>,
}
