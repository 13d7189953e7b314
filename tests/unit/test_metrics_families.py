"""The daemon's per-model metric families (controller.metrics.ModelFamily): cached text that a
Prometheus parser reads as the same series and values prometheus_client would expose, refreshed
when a value changes, and a model's series gone once it is forgotten."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.metrics import DaemonMetrics, ModelFamily


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name}


labels = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)


@given(series=st.dictionaries(st.tuples(labels, labels), st.floats(allow_nan=False), max_size=20))
def test_the_cached_text_parses_as_prometheus_clients_would(series: dict[tuple[str, str], float]) -> None:
    fam = ModelFamily("t_replicas", "Replicas.", ("model", "pool"))
    reg = CollectorRegistry()
    ref = Gauge("t_replicas", "Replicas.", ["model", "pool"], registry=reg)
    for (model, pool), value in series.items():
        fam.labels(model, pool).set(value)
        ref.labels(model=model, pool=pool).set(value)
    assert samples(fam.render().decode(), "t_replicas") == samples(generate_latest(reg).decode(), "t_replicas")


def test_a_changed_value_shows_and_a_forgotten_model_goes() -> None:
    m = DaemonMetrics()
    m.replicas.labels(model="a", pool="p", state="desired").set(3)
    m.replicas.labels(model="b", pool="p", state="desired").set(1)
    m.decisions.labels("a", "ScaleUp").inc()
    first = m.render()
    assert m.render() == first
    built: list[str] = []
    model_text = m.replicas._model_text
    m.replicas._model_text = lambda model: built.append(model) or model_text(model)  # type: ignore[method-assign]
    m.replicas.labels(model="a", pool="p", state="desired").set(5)
    m.decisions.labels("a", "ScaleUp").inc()
    text = m.render().decode()
    assert built == ["a"]  # only the changed model's text is rebuilt
    assert samples(text, "tidegate_replicas")[(("model", "a"), ("pool", "p"), ("state", "desired"))] == 5
    assert samples(text, "tidegate_decisions_total") == {(("model", "a"), ("reason", "ScaleUp")): 2}
    m.forget_model("a")
    text = m.render().decode()
    assert set(samples(text, "tidegate_replicas")) == {(("model", "b"), ("pool", "p"), ("state", "desired"))}
    assert samples(text, "tidegate_decisions_total") == {}
    # every family is still declared (HELP/TYPE) for Prometheus and the dashboard's name check
    assert {f.name for f in m.registry.collect()} >= {"tidegate_replicas", "tidegate_decisions", "tidegate_ticks"}


def test_removing_a_series_that_is_not_exposed_is_a_key_error() -> None:
    m = DaemonMetrics()
    m.signal_missing.labels("a", "kv").set(1)
    m.signal_missing.remove("a", "kv")
    try:
        m.signal_missing.remove("a", "kv")
    except KeyError:
        pass
    else:
        raise AssertionError("a second remove should raise KeyError, as prometheus_client's does")
    assert samples(m.render().decode(), "tidegate_signal_missing") == {}


def test_a_family_registered_in_core_after_construction_is_scraped_and_listed() -> None:
    """As ``providers.kubeobjects`` registers its own families once the daemon is built."""
    m = DaemonMetrics()
    Gauge("t_refused", "Refused.", ["pool"], registry=m.core).labels(pool="p").set(1)
    assert samples(m.render().decode(), "t_refused") == {(("pool", "p"),): 1}
    assert "t_refused" in {f.name for f in m.registry.collect()}
