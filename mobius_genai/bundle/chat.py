"""A conversation with a bundle: each reply is generated from the whole conversation so far,
rendered by the bundle's chat template, within the bundle's context.

Every turn renders and encodes the conversation again and starts a new generator: simple, and
always what the template makes of the turns kept (no cache carried over from tokens whose
re-encoded text tokenizes differently). When the next prompt would not leave room for the
reply, the oldest turns are dropped first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import onnxruntime_genai as og

from mobius_genai.bundle.bos import required_bos, with_bos
from mobius_genai.bundle.generate import chat_template, load_model, load_tokenizer
from mobius_genai.bundle.validate import read_genai_config
from mobius_genai.errors import BundleError


class Conversation:
    """The turns of a chat with the bundle in `folder` and the model that answers them.

    `search_options` are onnxruntime-genai search options laid over the bundle's; `note` is
    called with a sentence when turns are dropped to fit the context; `cpu` runs the bundle's
    graph on the CPU provider.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        system: str | None = None,
        max_new_tokens: int = 256,
        search_options: Mapping[str, Any] | None = None,
        note: Callable[[str], None] = lambda text: None,
        cpu: bool = False,
    ) -> None:
        config = read_genai_config(Path(folder))  # its shape checked before og parses it
        self.model = load_model(folder, cpu=cpu)
        self.template = chat_template(folder)
        if self.template is None:
            raise BundleError(
                f"{folder}: no chat template (chat_template.jinja, chat_template.json or "
                "tokenizer_config.json's chat_template); `mobius-genai run --raw` feeds text as is"
            )
        self.tokenizer = load_tokenizer(self.model, folder)
        self.bos = required_bos(folder)  # onnxruntime-genai's tokenizer does not add it
        context = config["model"]["context_length"]
        self.context = int(config.get("search", {}).get("max_length", context))
        self.folder = folder
        self.system = system
        self.max_new_tokens = max_new_tokens
        self.search_options = dict(search_options or {})
        self.turns: list[tuple[str, str]] = []
        """(user message, reply) of the turns kept, oldest first."""
        self.prompt_ids: list[int] = []
        """The tokens fed for the latest reply."""
        self._note = note
        self._eos = {int(token) for token in self.tokenizer.eos_token_ids}

    def reply(self, message: str) -> Iterator[str]:
        """Text pieces of the model's reply to `message`, as they are generated; the turn is
        kept once the reply is complete."""
        try:
            self.prompt_ids = self._fitted_prompt(message)
            params = og.GeneratorParams(self.model)
            length = min(len(self.prompt_ids) + self.max_new_tokens, self.context)
            params.set_search_options(**self.search_options, max_length=length)
            generator = og.Generator(self.model, params)
            generator.append_tokens(self.prompt_ids)
            stream = self.tokenizer.create_stream()
            pieces = []
            while not generator.is_done():
                generator.generate_next_token()
                token = int(generator.get_next_tokens()[0])
                if token in self._eos:
                    break
                pieces.append(stream.decode(token))
                yield pieces[-1]
        except RuntimeError as error:  # og's error type for template, tokenizer and run failures
            raise BundleError(
                f"{self.folder}: onnxruntime-genai failed to generate: {error}"
            ) from error
        self.turns.append((message, "".join(pieces)))

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
