"""The ORT format file laid out the same way every time it is written.

onnxruntime (1.31) writes the same content in a different byte layout each time it saves a model
in the ORT format: ``InferenceSession::SaveToOrtFormat`` ends with the kernel type string
resolver, whose entries it creates while iterating an absl hash map (``InlinedHashMap``, seeded
per process and per table). The vectors it writes are sorted by key, so a reader sees the same
entries in the same order, but the tables sit in creation order in the flatbuffer, so their
offsets, and the file's bytes, change from one save to the next (measured: four saves of one
model, in one process or in four, gave four different files).

``canonical_ort_bytes`` rewrites that part of the file: the resolver is built again, entry after
entry in the order the file lists them, in front of the model's bytes, which are kept as they
are (the model is written before the resolver, with offsets relative to itself), and the session
table is written last, as onnxruntime does. The content is unchanged; only the layout is fixed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: ``ArgType`` and index of one argument: (0 input / 1 output, index)
Arg = tuple[int, int]
#: an operator id (``domain:op_type:since_version``) and its kernel type strings with their arguments
Entry = tuple[bytes, list[tuple[bytes, list[Arg]]]]


def canonicalize_ort_file(path: Path) -> bool:
    """Rewrite the ORT format file at ``path`` in its canonical layout; False (file untouched)
    when its layout is not the one described in this module's docstring."""
    data = path.read_bytes()
    canonical = canonical_ort_bytes(data)
    if canonical is None:
        return False
    if canonical != data:
        path.write_bytes(canonical)
    return True


def _vtable(table: Any) -> int:
    """Where the vtable of a flatbuffers table is (its position minus the signed offset it starts with)."""
    import flatbuffers

    return int(table.Pos - table.Get(flatbuffers.number_types.SOffsetTFlags, table.Pos))


def _read_resolver(resolver: Any) -> tuple[list[Entry], list[int]]:
    """The resolver's entries, and the positions of its tables (their vtables may be shared with
    the model's tables: flatbuffers writes an identical vtable once)."""
    entries: list[Entry] = []
    positions = [resolver._tab.Pos]
    for i in range(resolver.OpKernelTypeStrArgsLength()):
        op = resolver.OpKernelTypeStrArgs(i)
        positions.append(op._tab.Pos)
        kinds = []
        for j in range(op.KernelTypeStrArgsLength()):
            kind = op.KernelTypeStrArgs(j)
            args = [kind.Args(k) for k in range(kind.ArgsLength())]
            positions += [kind._tab.Pos] + [a._tab.Pos for a in args]
            kinds.append((bytes(kind.KernelTypeStr()), [(int(a.ArgType()), int(a.Index())) for a in args]))
        entries.append((bytes(op.OpId()), kinds))
    return entries, positions


def _vector(builder: Any, offsets: list[int]) -> int:
    builder.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    return int(builder.EndVector())


def _write_resolver(builder: Any, entries: list[Entry]) -> int:
    from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs import (
        ArgTypeAndIndex,
        KernelTypeStrArgsEntry,
        KernelTypeStrResolver,
        OpIdKernelTypeStrArgsEntry,
    )

    ops = []
    for op_id, kinds in entries:
        kind_offsets = []
        for name, args in kinds:
            arg_offsets = []
            for arg_type, index in args:
                ArgTypeAndIndex.Start(builder)
                ArgTypeAndIndex.AddArgType(builder, arg_type)
                ArgTypeAndIndex.AddIndex(builder, index)
                arg_offsets.append(ArgTypeAndIndex.End(builder))
            arg_vector = _vector(builder, arg_offsets)
            name_offset = builder.CreateString(name)
            KernelTypeStrArgsEntry.Start(builder)
            KernelTypeStrArgsEntry.AddKernelTypeStr(builder, name_offset)
            KernelTypeStrArgsEntry.AddArgs(builder, arg_vector)
            kind_offsets.append(KernelTypeStrArgsEntry.End(builder))
        kind_vector = _vector(builder, kind_offsets)
        op_offset = builder.CreateString(op_id)
        OpIdKernelTypeStrArgsEntry.Start(builder)
        OpIdKernelTypeStrArgsEntry.AddOpId(builder, op_offset)
        OpIdKernelTypeStrArgsEntry.AddKernelTypeStrArgs(builder, kind_vector)
        ops.append(OpIdKernelTypeStrArgsEntry.End(builder))
    op_vector = _vector(builder, ops)
    KernelTypeStrResolver.Start(builder)
    KernelTypeStrResolver.AddOpKernelTypeStrArgs(builder, op_vector)
    return int(KernelTypeStrResolver.End(builder))


def canonical_ort_bytes(data: bytes) -> bytes | None:
    """``data`` (an ORT format file) with its kernel type string resolver and session table
    written again in a fixed order; None when the file is not laid out as expected (no resolver,
    or the resolver not entirely between the session table and the model)."""
    import flatbuffers
    from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs import InferenceSession

    session = InferenceSession.InferenceSession.GetRootAs(data, 0)
    model, resolver, table = session.Model(), session.KernelTypeStrResolver(), session._tab
    version_slot = table.Offset(4)
    if model is None or resolver is None or not version_slot:
        return None
    version = int(table.Indirect(table.Pos + version_slot))
    model_start = min(model._tab.Pos, _vtable(model._tab), version)  # the model and the version string: kept as they are
    entries, positions = _read_resolver(resolver)
    if not all(table.Pos < position < model_start for position in positions):
        return None
    end = len(data)
    builder = flatbuffers.Builder(0)
    slack = 2 * model_start + 1024  # room for the resolver written again, so that the buffer never grows
    builder.Bytes = bytearray(slack) + bytearray(data[model_start:])
    builder.head = slack
    builder.minalign = 8
    resolver_offset = _write_resolver(builder, entries)
    InferenceSession.Start(builder)
    InferenceSession.AddOrtVersion(builder, end - version)  # offsets count from the end of the buffer
    InferenceSession.AddModel(builder, end - model._tab.Pos)
    InferenceSession.AddKernelTypeStrResolver(builder, resolver_offset)
    builder.Finish(InferenceSession.End(builder), file_identifier=bytes(data[4:8]))
    return bytes(builder.Output())
