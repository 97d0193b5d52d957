"""`mobius-genai serve`: an OpenAI-compatible HTTP server over a bundle's onnxruntime-genai Engine.

`protocol` checks request bodies, `prompt` renders and bounds prompts, `media` says which audio
the bundle takes (clips in chat messages, Whisper's transcriptions), `tools` makes guidance
and reads tool calls, `output` assembles replies (stop strings, tool calls), `engine_loop` runs
the Engine on its own thread, `responses` writes OpenAI's shapes, `app` is the Starlette app and
`server` runs it on uvicorn. Starlette and uvicorn come with the [serve] extra.
"""
