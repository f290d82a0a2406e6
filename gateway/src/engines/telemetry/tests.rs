//! Each flavour's exposition as its server writes it (the shape from each
//! project's documentation and source: HELP/TYPE lines, model labels,
//! histograms beside the gauges; the numbers are ours).

use super::*;

const VLLM_V1: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 120.0
"#;

const VLLM_V0: &str = r#"# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama-2-7b"} 2.0
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="llama-2-7b"} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama-2-7b"} 0.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="llama-2-7b"} 0.125
"#;

const SGLANG: &str = r#"# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0075
"#;

const TGI: &str = r#"# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 4096
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 4
# TYPE tgi_queue_size gauge
tgi_queue_size 9
# TYPE tgi_request_count counter
tgi_request_count 1234
"#;

const LLAMACPP: &str = r#"# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.0625
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"#;

fn t(running: f64, waiting: f64, kv: Option<f64>) -> Telemetry {
    Telemetry { running: Some(running), waiting: Some(waiting), kv_usage: kv }
}

#[test]
fn each_flavour_reads_its_own_gauges() {
    assert_eq!(Flavour::Vllm.read(VLLM_V1), t(7.0, 3.0, Some(0.42)));
    assert_eq!(Flavour::Vllm.read(VLLM_V0), t(2.0, 0.0, Some(0.125)), "V0's gpu_cache_usage_perc");
    assert_eq!(Flavour::Sglang.read(SGLANG), t(12.0, 5.0, Some(0.28)));
    assert_eq!(Flavour::Tgi.read(TGI), t(4.0, 9.0, None), "TGI exposes no KV share");
    assert_eq!(Flavour::Llamacpp.read(LLAMACPP), t(2.0, 1.0, Some(0.0625)));
}

#[test]
fn another_flavours_exposition_or_none_reads_as_unknown() {
    assert_eq!(Flavour::Vllm.read(SGLANG), Telemetry::default());
    assert_eq!(Flavour::Generic.read(VLLM_V1), Telemetry::default());
    assert_eq!(Flavour::Llamacpp.read(""), Telemetry::default());
    assert!(!Flavour::Generic.has_metrics());
}

#[test]
fn series_of_one_gauge_are_summed_over_their_labels() {
    let two_models =
        "vllm:num_requests_running{model_name=\"a\"} 2\nvllm:num_requests_running{model_name=\"b\"} 3\n";
    assert_eq!(Flavour::Vllm.read(two_models).running, Some(5.0));
}

#[test]
fn labels_with_braces_quotes_and_timestamps_are_parsed() {
    let text = "m{path=\"/v1/{id}\",q=\"say \\\"}\\\"\"} 4 1700000000000\nm 1e1\n";
    let got: Vec<_> = samples(text).collect();
    assert_eq!(got, vec![("m", 4.0), ("m", 10.0)]);
}

#[test]
fn malformed_lines_are_skipped_and_bad_values_make_the_gauge_unknown() {
    let text = "garbage\nvllm:num_requests_running{unclosed=\"x 5\nvllm:num_requests_waiting NaN\n\
                vllm:kv_cache_usage_perc 1.7\n";
    let read = Flavour::Vllm.read(text);
    assert_eq!(read.running, None, "an unclosed label set is not a sample");
    assert_eq!(read.waiting, None, "NaN is not a queue length");
    assert_eq!(read.kv_usage, Some(1.0), "a share is clamped to 1");
    assert_eq!(Flavour::Tgi.read("tgi_queue_size -3\n").waiting, None);
}

#[test]
fn an_oversized_exposition_is_read_up_to_the_bound() {
    let mut text = String::from("llamacpp:requests_processing 1\n");
    while text.len() < MAX_EXPOSITION_BYTES {
        text.push_str("# padding padding padding padding padding padding padding padding\n");
    }
    text.push_str("llamacpp:requests_deferred 9\n");
    let read = Flavour::Llamacpp.read(&text);
    assert_eq!(read.running, Some(1.0));
    assert_eq!(read.waiting, None, "what lies past the bound is not read");
}
