"""Olive evaluators, metrics, goals and search strategy → Kiln's evaluate, select and search."""

from __future__ import annotations

import re
from typing import Any

LATENCY = {"avg": "mean_ms", "p50": "p50_ms", "p90": "p90_ms", "p95": "p95_ms", "p99": "p99_ms", "max": "max_ms", "min": "min_ms"}
THROUGHPUT = {"avg": "items_per_s"}
ACCURACY = {"accuracy_score": "top1", "f1_score": "f1_macro"}
#: Hugging Face evaluate's metrics (Olive's huggingface_metrics backend) Kiln's accuracy evaluator reports
HF_ACCURACY = {"accuracy": "top1"}
#: what Olive's per-metric user_config sets that Kiln sets on the target, and where
TARGET_SETTINGS = {
    "inference_settings": "Kiln runs every evaluation with the target's session (providers, provider and session options): set them on the target",
    "io_bind": "Kiln's ONNX Runtime targets bind I/O with io_binding: true",
    "shared_kv_buffer": "no Kiln evaluator option for it",
}
SIZE = {"bytes": "file_bytes"}
HIGHER_IS_BETTER = {"accuracy": True, "latency": False, "throughput": True, "size_on_disk": False}
SAMPLERS = {"tpe": "tpe", "random": "random", "sequential": "grid"}


def metric_name(name: str) -> str:
    """A custom metric's name as Kiln's custom evaluator takes it: letters, digits and underscores."""
    text = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or "metric"
    return f"m_{text}" if text[0].isdigit() else text


def _plain(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_-") or "metric"


def translate_evaluators(evaluators: dict[str, Any], chosen: Any, runtime: str, ctx: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Kiln's evaluate list and select section from the engine's Olive evaluator."""
    name = chosen if isinstance(chosen, str) else next(iter(evaluators), None)
    evaluator = chosen if isinstance(chosen, dict) else evaluators.get(name) if name else None
    for other in evaluators:
        if other != name:
            ctx.skip(f"evaluators.{other}", "not the engine's evaluator: Kiln evaluates with one set of metrics")
    evaluate: list[dict[str, Any]] = []
    ranked: list[tuple[int, str, bool, Any, str]] = []  # priority, kiln metric, higher is better, goal, where
    where = f"evaluators.{name}" if name else "evaluators"
    if isinstance(evaluator, dict) and evaluator.get("type"):  # an evaluator of its own kind (LMEvaluator, MTEBEvaluator...)
        tasks = ", ".join(map(str, evaluator.get("tasks") or []))
        ctx.skip(
            where,
            f"{evaluator['type']}{f' ({tasks})' if tasks else ''}: Kiln has no such evaluator; its evaluations are latency, "
            "throughput, accuracy, size, perplexity, generation and custom metrics",
        )
    else:
        for key, value in (evaluator or {}).items():
            if key != "metrics" and value not in (None, {}, []):
                ctx.skip(f"{where}.{key}", "no Kiln evaluation option for it")
    for index, metric in enumerate((evaluator or {}).get("metrics") or []):
        at = ctx.at = f"{where}.metrics[{index}]"
        entry = _metric(metric, at, ctx, ranked)
        if entry:
            evaluate.append(entry)
    if evaluate and not ranked:  # every sub-type was left out: nothing to rank by
        evaluate = []
    if not evaluate and runtime == "onnxruntime-genai":  # generation timing needs prompts: give a dataset
        ctx.notes.append("no Olive metric carried over: Kiln picks the smallest model (add a generation evaluation with prompts)")
        evaluate.append({"id": "size", "evaluator": "size"})
        ranked.append((1, "size.file_bytes", False, None, "evaluators"))
    elif not evaluate:
        ctx.notes.append("no Olive metric carried over: Kiln measures latency and picks the fastest model")
        evaluate.append({"id": "latency", "evaluator": "latency"})
        ranked.append((1, "latency.p50_ms", False, None, "evaluators"))
    return evaluate, _select(ranked, ctx)


def translate_metric(metric: dict[str, Any], at: str, ctx: Any) -> tuple[dict[str, Any] | None, list[tuple[int, str, bool, Any, str]]]:
    """One Olive metric as a Kiln evaluation, and its sub-types ranked: (priority, kiln metric, higher is better, goal, where)."""
    ranked: list[tuple[int, str, bool, Any, str]] = []
    return _metric(metric, at, ctx, ranked), ranked


def _metric(
    metric: dict[str, Any], at: str, ctx: Any, ranked: list[tuple[int, str, bool, Any, str]]
) -> dict[str, Any] | None:  # long: one branch per Olive metric type
    kind = str(metric.get("type", "")).lower()
    eid = _plain(str(metric.get("name") or kind))
    user = metric.get("user_config") or {}
    table = {"latency": LATENCY, "throughput": THROUGHPUT, "accuracy": ACCURACY, "size_on_disk": SIZE}.get(kind)
    entry: dict[str, Any] = {"id": eid, "evaluator": {"size_on_disk": "size"}.get(kind, kind)}
    config: dict[str, Any] = {}
    if kind == "custom":
        func = user.get("evaluate_func") or user.get("metric_func")
        if not (user.get("user_script") and func):
            ctx.skip(f"{at}.user_config", "a custom metric needs user_script and evaluate_func")
            return None
        raw = [str(s.get("name")) for s in metric.get("sub_types") or []]
        names = [metric_name(n) for n in raw]
        config = {"file": ctx.locate(str(user["user_script"])), "function": func, "metrics": names}
        ctx.notes.append(f"{at}: custom metric → Kiln's custom evaluator; Kiln calls {func}(run, data, **options): adapt its signature")
        table = dict(zip(raw, names, strict=True))
    elif kind == "accuracy" and metric.get("backend") == "huggingface_metrics":
        table = HF_ACCURACY
    elif table is None:
        ctx.skip(f"{at}.type", f"no Kiln evaluator for Olive's {kind or 'untyped'} metric")
        return None
    data = metric.get("data_config")
    if data and kind != "size_on_disk":
        config["data"] = ctx.dataset(data if isinstance(data, str) else data.get("name", "data"), f"{at}.data_config")
    for key, value in user.items():
        if key == "batch_size" and kind in ("latency", "throughput", "accuracy"):
            config["batch_size"] = int(value)
        elif key not in ("user_script", "evaluate_func", "metric_func", "script_dir", "data_dir") and value not in (None, {}, False):
            ctx.skip(f"{at}.user_config.{key}", TARGET_SETTINGS.get(key, "no Kiln evaluator option for it"))
    for index, sub in enumerate(metric.get("sub_types") or []):
        _sub_type(sub, kind, eid, table, f"{at}.sub_types[{index}]", config, ctx, ranked)
    if kind == "accuracy" and "data" not in config:
        config["data"] = ctx.dataset("accuracy_data", f"{at}.data_config")
    if config:
        entry["config"] = config
    return entry


def _sub_type(
    sub: dict[str, Any], kind: str, eid: str, table: dict[str, str], at: str, config: dict[str, Any], ctx: Any, ranked: list[Any]
) -> None:
    name = str(sub.get("name", ""))
    mc = sub.get("metric_config") or {}
    kiln = table.get(name)
    if name == "f1_score" and mc.get("average") == "micro":
        kiln = "f1_micro"
    if kiln is None:
        ctx.skip(f"{at}.name", f"Kiln's {kind} evaluator has no {name!r} (it reports {', '.join(table.values())})")
        return
    for key, value in mc.items():
        if kind == "latency" and key == "warmup_num":
            config["warmup"] = int(value)
        elif kind == "latency" and key == "repeat_test_num":
            config["runs"] = int(value)
        elif key == "top_k" and kind == "accuracy":
            config["top_k"] = [int(value)]
            kiln = f"top{int(value)}" if name == "accuracy_score" else kiln
        elif key not in ("task", "num_classes", "average", "sleep_num"):
            ctx.skip(f"{at}.metric_config.{key}", f"no option of Kiln's {kind} evaluator for it")
    higher = sub.get("higher_is_better", HIGHER_IS_BETTER.get(kind, True))
    ranked.append((int(sub.get("priority", -1)), f"{eid}.{kiln}", bool(higher), sub.get("goal"), at))


def _select(ranked: list[tuple[int, str, bool, Any, str]], ctx: Any) -> dict[str, Any]:
    first = min(ranked, key=lambda r: (r[0] < 1, r[0] if r[0] >= 1 else 0))
    select: dict[str, Any] = {"objective": {"metric": first[1], "goal": "max" if first[2] else "min"}}
    constraints = [c for r in ranked if r[3] for c in [_constraint(r[1], r[2], r[3], f"{r[4]}.goal", ctx)] if c]
    if constraints:
        select["constraints"] = constraints
    return select


def _constraint(metric: str, higher: bool, goal: dict[str, Any], at: str, ctx: Any) -> dict[str, Any] | None:
    kind, value = str(goal.get("type", "")), float(goal.get("value", 0))
    timing = metric.endswith("_ms") and metric.split(".", 1)[0] and not higher
    if kind == "threshold":
        return {"metric": metric, "min" if higher else "max": value}
    if kind == "max-degradation" and higher:
        return {"metric": metric, "max_drop": value}
    if kind == "percent-max-degradation" and higher:
        return {"metric": metric, "max_drop_ratio": value / 100}
    if timing and kind in ("percent-min-improvement", "percent-max-degradation"):
        ratio = 1 - value / 100 if kind == "percent-min-improvement" else 1 + value / 100
        speedup = f"{metric.split('.', 1)[0]}.speedup"
        ctx.notes.append(f"{at}: {kind} {value:g}% on {metric} → {speedup} >= {1 / ratio:.4g} (paired with the reference)")
        return {"metric": speedup, "min": round(1 / ratio, 4)}
    ctx.skip(at, f"Kiln has no {kind!r} bound for a metric where {'higher' if higher else 'lower'} is better")
    return None


def translate_search(strategy: Any, ctx: Any) -> dict[str, Any]:
    if not strategy:
        return {"sampler": "grid"}
    if strategy is True:
        strategy = {}
    sampler_config = strategy.get("sampler_config") or {}
    search: dict[str, Any] = {"sampler": SAMPLERS.get(str(strategy.get("sampler") or "tpe"), "tpe")}
    if strategy.get("sampler") and strategy["sampler"] not in SAMPLERS:
        ctx.skip("search_strategy.sampler", f"Kiln's samplers are grid, random and tpe; {strategy['sampler']!r} became tpe")
    budget = strategy.get("max_iter") or sampler_config.get("max_samples")
    if budget:
        search["max_candidates"] = int(budget)
    if strategy.get("max_time"):
        search["max_time_s"] = float(strategy["max_time"])
    if sampler_config.get("seed") is not None:
        search["seed"] = int(sampler_config["seed"])
    if str(strategy.get("execution_order", "joint")) == "pass-by-pass":
        ctx.skip("search_strategy.execution_order", "Kiln searches the passes jointly (each candidate is a whole path)")
    if strategy.get("stop_when_goals_met"):
        ctx.skip("search_strategy.stop_when_goals_met", "set search.stop_when to the bounds that end the search")
    if (strategy.get("output_model_num") or 1) > 1:
        ctx.skip("search_strategy.output_model_num", "Kiln writes the best model per target; output.keep: pareto keeps the front")
    for key in sampler_config:
        if key not in ("max_samples", "seed"):
            ctx.skip(f"search_strategy.sampler_config.{key}", "no Kiln search option for it")
    return search


def shape_problems(config: dict[str, Any]) -> list[tuple[str, str, str]]:  # long: one check per structural key of a RunConfig
    """The structural keys of an Olive config whose type is wrong: (key path, expected, given type)."""
    found: list[tuple[str, str, str]] = []

    def want(value: Any, kinds: tuple[type, ...], where: str, expected: str) -> bool:
        if value is None or isinstance(value, kinds):
            return value is not None
        found.append((where, expected, type(value).__name__))
        return False

    want(config.get("input_model"), (dict,), "input_model", "an object with a type")
    want(config.get("engine"), (dict,), "engine", "an object")
    want(config.get("search_strategy"), (dict, bool), "search_strategy", "an object or true/false")
    if want(config.get("passes"), (dict,), "passes", "an object: pass name -> pass config"):
        for name, value in config["passes"].items():
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                want(item, (dict,), f"passes.{name}" + (f"[{i}]" if isinstance(value, list) else ""), "an object with a type")
    if want(config.get("systems"), (dict,), "systems", "an object: system name -> system config"):
        for name, value in config["systems"].items():
            want(value, (dict,), f"systems.{name}", "an object with a type")
    if want(config.get("data_configs"), (list,), "data_configs", "a list of data configs"):
        for i, value in enumerate(config["data_configs"]):
            want(value, (dict,), f"data_configs[{i}]", "an object with a name and a type")
    if want(config.get("evaluators"), (dict,), "evaluators", "an object: evaluator name -> {metrics: [...]}"):
        for name, value in config["evaluators"].items():
            if want(value, (dict,), f"evaluators.{name}", "an object with metrics") and want(
                value.get("metrics"), (list,), f"evaluators.{name}.metrics", "a list of metrics"
            ):
                for i, metric in enumerate(value["metrics"]):
                    at = f"evaluators.{name}.metrics[{i}]"
                    if want(metric, (dict,), at, "an object with a name and a type") and want(
                        metric.get("sub_types"), (list,), f"{at}.sub_types", "a list"
                    ):
                        for j, sub in enumerate(metric["sub_types"]):
                            if want(sub, (dict,), f"{at}.sub_types[{j}]", "an object with a name"):
                                want(sub.get("priority"), (int,), f"{at}.sub_types[{j}].priority", "an integer")
                                if want(sub.get("goal"), (dict,), f"{at}.sub_types[{j}].goal", "an object {type, value}"):
                                    want(sub["goal"].get("value"), (int, float), f"{at}.sub_types[{j}].goal.value", "a number")
    return found
