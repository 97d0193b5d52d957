"""Model kinds: what a text decoder, a vision-language model (and next a speech model) build,
write into a bundle and smoke-test, each behind one interface (`base.ModelKind`) looked up from
one table (`table.KINDS`), so that `build()`, the packager and validate never ask which kind
they hold.

Kept light on purpose: `og_types` (onnxruntime-genai's facts per model.type) is read by the
smoke test's process and by `run`, which import no graph-building stack; the kinds themselves
live in `table`, `text` and `vision_language`.
"""
