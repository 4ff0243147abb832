"""The small public SDK that passes, evaluators and targets are written against.

It imports only the standard library and pydantic, so importing it costs nothing; numpy comes in
with ``engine.core.data``, which plugins import when they need datasets.
"""

from __future__ import annotations

from engine.core.artifact import FORMATS, ArtifactFormat, ModelArtifact, known_format, register_format
from engine.core.config import StrictConfig, library_versions
from engine.core.errors import (
    EvaluationError,
    InputError,
    KilnError,
    MissingDependency,
    PassError,
    Problem,
    SettingInapplicable,
    TargetUnavailable,
)
from engine.core.evaluator import EvalContext, Evaluator, EvaluatorConfig, MetricResult
from engine.core.hashing import canonical_json, digest_tree, sha256_json
from engine.core.passes import Pass, PassConfig, PassContext, PassResult
from engine.core.refs import CodePath, DatasetRef, EvaluationRef, FileOrInput, FilePath, InputModelField, InputTask, RefKind, references
from engine.core.search import Categorical, Distribution, FloatRange, IntRange, Outcome, Sampler, Trial, TrialState
from engine.core.target import Availability, Generation, GenerativeSession, Seq2SeqSession, Session, Target, TargetConfig, TensorSpec

__all__ = [
    "FORMATS",
    "ArtifactFormat",
    "Availability",
    "Categorical",
    "CodePath",
    "DatasetRef",
    "Distribution",
    "EvalContext",
    "EvaluationError",
    "EvaluationRef",
    "Evaluator",
    "EvaluatorConfig",
    "FileOrInput",
    "FilePath",
    "FloatRange",
    "Generation",
    "GenerativeSession",
    "InputError",
    "InputModelField",
    "InputTask",
    "IntRange",
    "KilnError",
    "MetricResult",
    "MissingDependency",
    "ModelArtifact",
    "Outcome",
    "Pass",
    "PassConfig",
    "PassContext",
    "PassError",
    "PassResult",
    "Problem",
    "RefKind",
    "Sampler",
    "Seq2SeqSession",
    "Session",
    "SettingInapplicable",
    "StrictConfig",
    "Target",
    "TargetConfig",
    "TargetUnavailable",
    "TensorSpec",
    "Trial",
    "TrialState",
    "canonical_json",
    "digest_tree",
    "known_format",
    "library_versions",
    "references",
    "register_format",
    "sha256_json",
]
