"""A conversation with a bundle: each reply is generated from the whole conversation so far,
rendered by the bundle's chat template, within the bundle's context.

Every turn renders and encodes the conversation again: always what the template makes of the
turns kept. The tokens go to the `decoding.Decoder`, whose Engine request feeds only what
follows the tokens it already holds when the new prompt starts with them (no cache carried over
from tokens whose re-encoded text tokenizes differently). When the next prompt would not leave
room for the reply, the oldest turns are dropped first.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from mobius_genai.bundle.bos import required_bos, with_bos
from mobius_genai.errors import BundleError
from mobius_genai.runtime.decoding import Decoder
from mobius_genai.runtime.generate import chat_template, load_tokenizer
from mobius_genai.runtime.opening import ON_CPU, OpenBundle, open_bundle
from mobius_genai.runtime.placeholders import require_media


class Conversation:
    """The turns of a chat with a bundle (its folder, or the bundle opened already) and the
    model that answers them.

    `search_options` are onnxruntime-genai search options laid over the bundle's when it is
    opened here (an opened bundle has its own); `note` is
    called with a sentence when turns are dropped to fit the context (and when og's Engine does
    not run the bundle); `cpu` runs the bundle's graph on the CPU provider; `max_length` is the
    context the conversation keeps within (default: the bundle's search.max_length).
    """

    def __init__(
        self,
        bundle: str | Path | OpenBundle,
        *,
        system: str | None = None,
        max_new_tokens: int = 256,
        search_options: Mapping[str, Any] | None = None,
        note: Callable[[str], None] = lambda text: None,
        cpu: bool = False,
        max_length: int | None = None,
    ) -> None:
        if not isinstance(bundle, OpenBundle):
            provider = ON_CPU if cpu else None
            bundle = open_bundle(bundle, command="chat", provider=provider, search=search_options)
        folder = bundle.folder
        self.template = chat_template(folder)
        if self.template is None:
            raise BundleError(
                f"{folder}: no chat template (chat_template.jinja, chat_template.json or "
                "tokenizer_config.json's chat_template); `mobius-genai run --raw` feeds text as is"
            )
        self.model = bundle.model
        self.tokenizer = load_tokenizer(self.model, folder)
        self.bos = required_bos(folder)  # onnxruntime-genai's tokenizer does not add it
        self.context = bundle.default_max_length if max_length is None else max_length
        self.folder = folder
        self.config = bundle.config
        self.system = system
        self.max_new_tokens = max_new_tokens
        self.turns: list[tuple[str, str]] = []
        """(user message, reply) of the turns kept, oldest first."""
        self.prompt_ids: list[int] = []
        """The tokens fed for the latest reply."""
        self.decoder = Decoder(bundle, note)
        self._note = note
        self._eos = {int(token) for token in self.tokenizer.eos_token_ids}

    @property
    def finish(self) -> str | None:
        """Why the latest reply ended: "eos", "length" (max_new_tokens), "context" (the
        context is full) or "stopped" (Ctrl-C); None before the first."""
        return self.decoder.finish

    def reply(self, message: str) -> Iterator[str]:
        """Text pieces of the model's reply to `message`, as they are generated; the turn is
        kept once the reply ends, also when it is stopped midway (with the text so far). A
        message or system message placing an image or a clip is an OptionError: a chat has
        none to give."""
        for text in (self.system or "", message):
            require_media(self.folder, self.config, text)
        try:
            self.prompt_ids = self._fitted_prompt(message)
        except RuntimeError as error:  # og's error type for template and tokenizer failures
            raise BundleError(
                f"{self.folder}: onnxruntime-genai cannot encode the conversation: {error}"
            ) from error
        stream = self.tokenizer.create_stream()
        pieces: list[str] = []
        tokens = self.decoder.tokens(
            self.prompt_ids,
            max_new_tokens=self.max_new_tokens,
            max_length=self.context,
        )
        try:
            with contextlib.closing(tokens):
                for token in tokens:
                    if token not in self._eos:  # the last token when it comes
                        pieces.append(stream.decode(token))
                        yield pieces[-1]
        finally:
            if self.finish is not None:
                self.turns.append((message, "".join(pieces)))

    def reset(self) -> None:
        """Forget the turns (the system message stays)."""
        self.turns.clear()
        self.decoder.reset()

    def _fitted_prompt(self, message: str) -> list[int]:
        """The tokens of the conversation with `message` last, after dropping the oldest turns
        while the prompt leaves less than the reply's room (max_new_tokens, at most half the
        context); a BundleError when `message` alone leaves none."""
        room = min(self.max_new_tokens, self.context // 2)
        while True:
            ids = with_bos(self.tokenizer.encode(self._rendered(message)), self.bos)
            if len(ids) + room <= self.context or not self.turns:
                break
            del self.turns[0]
            self._note(
                f"dropped the oldest turn to fit the context ({self.context} tokens); "
                f"{len(self.turns)} earlier turn(s) kept"
            )
        if len(ids) >= self.context:
            raise BundleError(
                f"the message takes {len(ids)} tokens with the chat template, the bundle's "
                f"context holds {self.context} (search.max_length); accepted: a shorter message"
            )
        return ids

    def _rendered(self, message: str) -> str:
        messages = [{"role": "system", "content": self.system}] if self.system else []
        for user, reply in self.turns:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        messages.append({"role": "user", "content": message})
        return self.tokenizer.apply_chat_template(
            json.dumps(messages), template_str=self.template, add_generation_prompt=True
        )
