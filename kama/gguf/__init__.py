"""GGUF, llama.cpp's model file format, as far as Kama reads it: the header only.

Before Kama schedules a llama-server it must know what a model file is (architecture,
size, native context, attention geometry, how the bytes are split over tensors and
shards) and whether it is a well-formed GGUF at all. The package is pure, in layers:

- ``header``: what a parsed header is (``GGUFHeader``, ``TensorInfo``), the caps the
  parser keeps to (``HeaderLimits``) and the one error every defect is (``InvalidGGUF``);
- ``reader``: the bounded parser, bytes from a stream in, a ``GGUFHeader`` out;
- ``bounds`` and ``facts``: what one header says (``GGUFFacts``), typed and bounded;
- ``shards``: split file names, complete shard sets (``MissingShard``) and the facts of
  a whole model;
- ``artifact_status``: those facts as the artifact status's ``gguf`` (``GGUFInfo``).

Opening files is not done here: ``activities.gguf_files`` opens a model's files and
hands each stream to the reader. Import the submodule that defines a name; this
package re-exports nothing, so a caller that needs only ``parse_shard_name`` (the
serving pod's runtime) loads neither the parser nor the API models.
"""
