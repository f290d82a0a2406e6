//! The spans of one traced sequence (docs/operations.md "Tracing"). The
//! scheduler notes wall-clock times as the sequence moves (admitted,
//! prefilled, each decode batch it was in); the spans are written when
//! the sequence is dropped, under the gateway's attempt span its
//! `traceparent` named: `engine.generate` (server) with `queue`,
//! `prefill` and `decode` inside. Only sequences the gateway traces carry
//! one; nothing is noted for the others.

use std::time::SystemTime;

use telemetry::{Context, KeyValue, SpanKind, Status, TraceContextExt as _};

pub(super) struct SeqTrace {
    parent: Context,
    admitted: SystemTime,
    prompt_tokens: u32,
    /// Prefill start and end, the batch's size and the tokens found cached.
    prefill: Option<(SystemTime, SystemTime, usize, u32)>,
    decode_steps: u32,
    batch_sum: u64,
    batch_min: usize,
    batch_max: usize,
    preemptions: u32,
    /// Times paused for a higher class.
    pauses: u32,
    /// How it ended: a finish reason, or an error code (`None`: cancelled).
    outcome: Option<Result<&'static str, String>>,
    generated: u32,
}

impl SeqTrace {
    /// A sequence admitted now under `parent`; `None` when tracing is off
    /// or the request carried no valid `traceparent`.
    pub(super) fn start(parent: Option<Context>, prompt_tokens: u32) -> Option<Box<Self>> {
        let parent = parent.filter(|cx| telemetry::enabled() && cx.span().span_context().is_valid())?;
        Some(Box::new(Self {
            parent,
            admitted: crate::clock::wall(),
            prompt_tokens,
            prefill: None,
            decode_steps: 0,
            batch_sum: 0,
            batch_min: usize::MAX,
            batch_max: 0,
            preemptions: 0,
            pauses: 0,
            outcome: None,
            generated: 0,
        }))
    }

    /// Its first prefill ran from `started` to now in a batch of `batch`.
    pub(super) fn prefilled(&mut self, started: SystemTime, batch: usize, cached_tokens: u32) {
        if self.prefill.is_none() {
            self.prefill = Some((started, crate::clock::wall(), batch, cached_tokens));
        }
    }

    /// It was in a decode batch of `batch` sequences.
    pub(super) fn decoded(&mut self, batch: usize) {
        self.decode_steps += 1;
        self.batch_sum += batch as u64;
        self.batch_min = self.batch_min.min(batch);
        self.batch_max = self.batch_max.max(batch);
    }

    pub(super) fn paused(&mut self) {
        self.pauses += 1;
    }

    pub(super) fn preempted(&mut self) {
        self.preemptions += 1;
    }

    pub(super) fn ended(&mut self, outcome: Result<&'static str, String>, generated: u32) {
        self.outcome.get_or_insert(outcome);
        self.generated = generated;
    }

    /// The span's status and the finish reason it reports.
    fn outcome(&self) -> (Status, String) {
        match &self.outcome {
            Some(Ok(r)) => (Status::Ok, (*r).to_string()),
            Some(Err(code)) => (Status::error(code.clone()), code.clone()),
            None => (Status::error("cancelled"), "cancelled".into()),
        }
    }

    /// `queue`, `prefill` and `decode` below `root`, the last up to `end`.
    fn phases(&self, root: &Context, end: SystemTime) {
        let phase = |name, from, to, attrs| {
            telemetry::span(root, name, SpanKind::Internal, Some(from), attrs).span().end_with_timestamp(to);
        };
        phase("queue", self.admitted, self.prefill.map_or(end, |p| p.0), Vec::new());
        let Some((from, to, batch, cached)) = self.prefill else { return };
        phase(
            "prefill",
            from,
            to,
            vec![
                KeyValue::new("slo.engine.batch_size", batch as i64),
                KeyValue::new("slo.engine.cached_tokens", i64::from(cached)),
            ],
        );
        if self.decode_steps > 0 {
            phase(
                "decode",
                to,
                end,
                vec![
                    KeyValue::new("slo.engine.decode_steps", i64::from(self.decode_steps)),
                    KeyValue::new("slo.engine.batch_size.min", self.batch_min as i64),
                    KeyValue::new(
                        "slo.engine.batch_size.mean",
                        self.batch_sum as f64 / f64::from(self.decode_steps),
                    ),
                    KeyValue::new("slo.engine.batch_size.max", self.batch_max as i64),
                ],
            );
        }
    }
}

impl Drop for SeqTrace {
    fn drop(&mut self) {
        let end = crate::clock::wall();
        let (status, reason) = self.outcome();
        let root = telemetry::span(
            &self.parent,
            "engine.generate",
            SpanKind::Server,
            Some(self.admitted),
            vec![
                KeyValue::new("gen_ai.usage.input_tokens", i64::from(self.prompt_tokens)),
                KeyValue::new("gen_ai.usage.output_tokens", i64::from(self.generated)),
                KeyValue::new("gen_ai.response.finish_reasons", reason),
                KeyValue::new("slo.engine.preemptions", i64::from(self.preemptions)),
                KeyValue::new("slo.engine.priority_pauses", i64::from(self.pauses)),
            ],
        );
        self.phases(&root, end);
        let span = root.span();
        span.set_status(status);
        span.end_with_timestamp(end);
    }
}
