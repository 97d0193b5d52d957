"""Running a bundle with onnxruntime-genai: open it (`opening`), generate (`generate`,
`decoding`, `chat`), place it on a provider (`placement`), and the smoke test `package` runs."""
