"""Renders a model's own chat template (GGUF `tokenizer.chat_template`, Jinja) safely."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app import resources

# Used when a GGUF carries no template: ChatML, the most common convention.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# Architectures whose models often carry no template, and the one they were trained with
# (resources/chat_templates/README.md says where each comes from).
_BUILTIN = {"deepseek4": "deepseek-v4", "deepseek_v4": "deepseek-v4"}
_RELEASES = ("0731",)  # a release whose template differs, named in the model's name


def builtin_template(architecture: str, name: str) -> str | None:
    """The template a model of `architecture` was trained with, for one that carries none
    (the 0731 release's when `name` says so); None where Stoke has none (ChatML then)."""
    base = _BUILTIN.get(architecture)
    if base is None:
        return None
    release = next((r for r in _RELEASES if r in name), None)
    return resources.read_text(f"chat_templates/{base}{f'-{release}' if release else ''}.jinja")


class TemplateError(Exception):
    """The chat template failed to render these messages; the message says why."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: object, indent: int | None = None, **_: object) -> str:
    """`tojson` as Hugging Face renders templates (no HTML escaping, Unicode kept): the
    templates were written against it, and it keeps the transcript's sentinels intact."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _hashable(value: object) -> object:
    return value if isinstance(value, str | int | float | bool | None) else _tojson(value)


class ChatTemplate:
    """A compiled chat template plus the special-token strings it refers to."""

    def __init__(
        self,
        source: str | None,
        *,
        bos_token: str = "",
        eos_token: str = "",
        variables: Mapping[str, object] | None = None,
    ) -> None:
        self.source = source or CHATML
        self.bos_token = bos_token
        self.eos_token = eos_token
        # e.g. enable_thinking, for templates that read it; `tools` for the server's requests
        self.variables = dict(variables or {})

    @property
    def key(self) -> tuple[str, tuple[tuple[str, object], ...]]:
        """Two templates with equal keys render every conversation the same."""
        return self.source, tuple(sorted((k, _hashable(v)) for k, v in self.variables.items()))

    @property
    def supports_reasoning_switch(self) -> bool:
        return "enable_thinking" in self.source

    @cached_property
    def _template(self) -> jinja2.Template:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.filters["tojson"] = _tojson
        try:
            return env.from_string(self.source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"The model's chat template does not parse: {exc}") from exc

    def render(
        self, messages: Sequence[Mapping[str, object]], *, add_generation_prompt: bool
    ) -> str:
        try:
            return self._template.render(
                **self.variables,
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"The model's chat template failed: {exc}") from exc
