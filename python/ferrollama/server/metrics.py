"""/metrics: Prometheus text (llama-server's llamacpp:* figures under ferrollama_*).

The scheduler's counters are read when scraped (nothing is updated on the decode path); only
the request counts by route and status are counted as requests end.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

KNOWN_PATHS = {"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/v1/embeddings",
               "/embeddings", "/tokenize", "/detokenize", "/v1/models", "/models", "/health", "/slots", "/metrics"}


class _SchedulerCollector:
    def __init__(self, scheduler):
        self.scheduler = scheduler

    def collect(self):
        s, st = self.scheduler, self.scheduler.stats
        counters = [
            ("ferrollama_prompt_tokens", "prompt tokens of the requests served", st.prompt_tokens),
            ("ferrollama_prompt_tokens_decoded", "prompt tokens decoded (the others came from the cache)",
             st.prompt_tokens_decoded),
            ("ferrollama_prompt_tokens_reused", "prompt tokens reused from the slot's own cache", st.prompt_tokens_reused),
            ("ferrollama_prompt_tokens_copied", "prompt tokens copied from another slot (seq_cp)", st.prompt_tokens_copied),
            ("ferrollama_tokens_predicted", "tokens generated", st.generated_tokens),
            ("ferrollama_decode_steps", "decode steps (batches)", st.decode_steps),
            ("ferrollama_jobs_done", "generations finished", st.requests_done),
            ("ferrollama_jobs_failed", "generations the engine failed", st.requests_failed),
            ("ferrollama_jobs_cancelled", "generations cancelled (client gone)", st.requests_cancelled),
        ]
        for name, doc, value in counters:
            yield CounterMetricFamily(name, doc, value=value)
        rate = st.generated_tokens / st.decode_seconds if st.decode_seconds > 0 else 0.0
        gauges = [
            ("ferrollama_requests_waiting", "generations waiting for a slot", s.queue_length),
            ("ferrollama_slots_busy", "slots serving a generation", s.slots_busy),
            ("ferrollama_slots_total", "slots (parallel sequences)", s.n_seq),
            ("ferrollama_predicted_tokens_seconds", "generated tokens per second of decoding", rate),
        ]
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=value)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, scheduler):
        self.registry = CollectorRegistry()
        self.requests = Counter("ferrollama_requests", "HTTP requests by route and status", ["path", "status"],
                                registry=self.registry)
        self.registry.register(_SchedulerCollector(scheduler))

    def count_request(self, path: str, status: int) -> None:
        # unknown paths share one label: a client cannot grow the series without bound
        self.requests.labels(path if path in KNOWN_PATHS else "other", str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
