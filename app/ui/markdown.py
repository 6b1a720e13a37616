"""Markdown to the HTML subset QTextBrowser understands, with highlighted, copyable code.

QTextBrowser speaks a small dialect of HTML 4 with inline CSS and no classes, and it pads
every block with its own default margins. So everything here is styled inline, margins are
set explicitly, and code blocks are one-cell tables (the only boxes Qt draws with a
background and padding). Raw HTML in a message is shown as text, never interpreted.
LaTeX math (`$...$`, `$$...$$`, `\\(...\\)`, `\\[...\\]`, found by mdit-py-plugins, so code
and prices such as "$5 and $6" are left alone) becomes images from app/ui/formulas.py.
"""

from __future__ import annotations

import functools
import html
from dataclasses import dataclass

from markdown_it import MarkdownIt
from markdown_it.token import Token
from mdit_py_plugins.dollarmath import dollarmath_plugin
from mdit_py_plugins.texmath import texmath_plugin
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_by_name, guess_lexer
from pygments.util import ClassNotFound

from app.ui import formulas, theme
from app.ui.formulas import Formula

MONO_FONTS = "'JetBrains Mono', 'SF Mono', Menlo, Consolas, 'DejaVu Sans Mono', monospace"
_BLOCK_GAP_PX = 10
_LINE_HEIGHT = "130%"  # Qt's default leading is tight for paragraphs of prose
_GUESS_MIN_CHARS = 40  # below this pygments' guesses are mostly noise
_SAFE_SCHEMES = ("http://", "https://", "mailto:")
_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"
_LEAF_BLOCKS = frozenset({"fence", "code_block", "hr"})


@dataclass(frozen=True)
class RenderedMarkdown:
    """The HTML to show, and each code block's exact text for the copy:N links."""

    html: str
    code_blocks: tuple[str, ...]
    formulas: tuple[Formula, ...] = ()  # shown through their `math:` image names


@dataclass(frozen=True)
class _Colors:
    code_style: str
    code_bg: str
    code_header_bg: str
    code_header_fg: str
    border: str
    inline_code_bg: str
    quote_fg: str
    link: str


_LIGHT = _Colors(**theme.MARKDOWN["light"])
_DARK = _Colors(**theme.MARKDOWN["dark"])


def split_reasoning(text: str) -> tuple[str | None, str]:
    """Separate a leading <think> block from the answer.

    Reasoning models stream their thoughts first; an unterminated block (still streaming)
    is all reasoning and no answer yet. A bare prefix of "<think>" counts as the start of
    one, so a streaming bubble does not flash the tag before it is complete.
    """
    stripped = text.lstrip()
    if not stripped:
        return None, text
    if not stripped.startswith(_THINK_OPEN):
        if _THINK_OPEN.startswith(stripped):
            return "", ""
        return None, text
    body = stripped[len(_THINK_OPEN) :]
    end = body.find(_THINK_CLOSE)
    if end < 0:
        return body.strip(), ""
    return body[:end].strip(), body[end + len(_THINK_CLOSE) :].lstrip()


def render(text: str, *, dark: bool) -> RenderedMarkdown:
    """Render one message's Markdown for a QTextBrowser."""
    colors = _DARK if dark else _LIGHT
    ink = theme.CHAT["dark" if dark else "light"]["text"]
    env: dict = {"colors": colors, "code_blocks": [], "formulas": [], "ink": ink}
    tokens = _MD.parse(text, env)
    _style_blocks(tokens, colors)
    body = _MD.renderer.render(tokens, _MD.options, env).rstrip()  # Qt shows a trailing "\n"
    return RenderedMarkdown(
        html=body, code_blocks=tuple(env["code_blocks"]), formulas=tuple(env["formulas"])
    )


def formula_name(formula: Formula) -> str:
    """The image name a formula has in the HTML (its content: re-renders hit the cache)."""
    return f"math:{hash(formula) & 0xFFFFFFFFFFFF:x}"


def render_plain(text: str) -> RenderedMarkdown:
    """A user's message as typed: every line break and space kept, HTML shown as text.

    People paste code, logs and lists; read as Markdown their lines would merge."""
    body = html.escape(text).replace("\n", "<br/>")
    style = f"margin:0px; line-height:{_LINE_HEIGHT}; white-space:pre-wrap;"
    return RenderedMarkdown(html=f'<p style="{style}">{body}</p>', code_blocks=())


def _validate_link(url: str) -> bool:
    """Only web and mail links become anchors; anything else stays plain text."""
    return url.strip().lower().startswith(_SAFE_SCHEMES)


def _style_blocks(tokens: list[Token], colors: _Colors) -> None:
    """Replace Qt's default block margins with one even gap between sibling blocks."""
    previous: Token | None = None
    for token in tokens:
        is_leaf = token.type in _LEAF_BLOCKS
        if token.nesting == 1 or is_leaf:
            follows_sibling = previous is not None and (
                (previous.nesting == -1 and not previous.hidden) or previous.type in _LEAF_BLOCKS
            )
            top = _BLOCK_GAP_PX if follows_sibling and token.type != "list_item_open" else 0
            if is_leaf:
                token.meta["top"] = top
            else:
                token.attrSet("style", _block_style(token, top, colors))
        if token.type == "inline":
            for child in token.children or []:
                if child.type == "link_open":
                    child.attrSet("style", f"color:{colors.link};")
        else:
            previous = token


def _block_style(token: Token, top: int, colors: _Colors) -> str:
    """Inline CSS for one opening tag: Qt ignores classes but honours these properties."""
    style = f"margin-top:{top}px; margin-bottom:0px;"
    if token.type in ("paragraph_open", "list_item_open"):
        style += f" line-height:{_LINE_HEIGHT};"
    elif token.type == "heading_open":
        size = {"h1": "x-large", "h2": "large"}.get(token.tag, "medium")
        style += f" font-size:{size}; font-weight:600;"
    elif token.type == "blockquote_open":
        style += f" margin-left:16px; color:{colors.quote_fg};"
    elif token.type == "table_open":
        token.attrSet("border", "1")
        token.attrSet("cellspacing", "0")
        token.attrSet("cellpadding", "6")
        style += f" border-collapse:collapse; {_border(colors)}"
    elif token.type in ("th_open", "td_open"):
        align = token.attrGet("style")  # markdown-it's column alignment
        style = f"{align};" if align else ""
        if token.type == "th_open":
            style += f" background-color:{colors.code_header_bg};"
    return style


def _border(colors: _Colors) -> str:
    """Qt's default table border is a 3D "outset"; chat tables want a flat hairline."""
    return f"border-style:solid; border-color:{colors.border};"


def _lexer_for(code: str, lang: str) -> Lexer:
    """The fence's language, else a guess for longer snippets, else plain text."""
    if lang:
        try:
            return get_lexer_by_name(lang)
        except ClassNotFound:
            return TextLexer()
    if len(code) >= _GUESS_MIN_CHARS:
        try:
            return guess_lexer(code)
        except ClassNotFound:
            pass
    return TextLexer()


@functools.lru_cache(maxsize=512)
def _highlight(code: str, lang: str, style: str) -> tuple[str, str]:
    """Highlighted spans and the label for the header; cached since streaming re-renders."""
    lexer = _lexer_for(code, lang)
    label = lang or (lexer.aliases[0] if lexer.aliases and lexer.name != "Text only" else "text")
    formatter = HtmlFormatter(nowrap=True, noclasses=True, style=style)
    return highlight(code, lexer, formatter).rstrip("\n"), label


def _fence(self, tokens: list[Token], idx: int, options: dict, env: dict) -> str:
    """A code block as a header row (language, Copy link) over the highlighted code."""
    token = tokens[idx]
    info = token.info.strip()
    lang = info.split(maxsplit=1)[0] if info else ""
    code = token.content.removesuffix("\n")
    colors: _Colors = env["colors"]
    index = len(env["code_blocks"])
    env["code_blocks"].append(code)
    spans, label = _highlight(code, lang, colors.code_style)
    top = token.meta.get("top", 0)
    border = _border(colors)
    return (
        f'<table width="100%" cellspacing="0" cellpadding="0" border="1" '
        f'style="margin-top:{top}px; margin-bottom:0px; border-collapse:collapse; {border}">'
        f'<tr><td style="padding:4px 10px; background-color:{colors.code_header_bg};">'
        f'<table width="100%" cellspacing="0" cellpadding="0" border="0"><tr>'
        f'<td style="color:{colors.code_header_fg}; font-size:small;">{html.escape(label)}</td>'
        f'<td align="right"><a href="copy:{index}" style="font-size:small; '
        f'color:{colors.link}; text-decoration:none;">Copy</a></td></tr></table></td></tr>'
        f'<tr><td style="padding:10px 12px; background-color:{colors.code_bg};">'
        f'<pre style="margin:0px; white-space:pre-wrap; font-family:{MONO_FONTS};">'
        f"{spans}</pre></td></tr></table>\n"
    )


def _code_inline(self, tokens: list[Token], idx: int, options: dict, env: dict) -> str:
    """Inline code on a tint; Qt has no inline padding, so thin spaces stand in for it."""
    colors: _Colors = env["colors"]
    return (
        f'<code style="font-family:{MONO_FONTS}; background-color:{colors.inline_code_bg};">'
        f"&nbsp;{html.escape(tokens[idx].content)}&nbsp;</code>"
    )


def _image(self, tokens: list[Token], idx: int, options: dict, env: dict) -> str:
    """Images become links: a chat bubble never fetches or reads files on its own."""
    token = tokens[idx]
    alt = html.escape(self.renderInlineAsText(token.children or [], options, env) or "image")
    src = str(token.attrGet("src") or "")
    if not _validate_link(src):
        return alt
    return f'<a href="{html.escape(src)}">{alt}</a>'


def _math(display: bool, block: bool):
    """The render rule of one kind of math token: its image, or its source when it fails."""
    closing = {"$": "$", "$$": "$$", "\\(": "\\)", "\\[": "\\]"}

    def rule(self, tokens: list[Token], idx: int, options: dict, env: dict) -> str:
        token = tokens[idx]
        formula = formulas.typeset(token.content, display, env["ink"])
        if formula is None:
            source = html.escape(f"{token.markup}{token.content}{closing[token.markup]}")
            return f'<p style="margin:0px;">{source}</p>\n' if block else source
        env["formulas"].append(formula)
        alt = html.escape(token.content.strip(), quote=True)
        img = (
            f'<img src="{formula_name(formula)}" width="{formula.width}" '
            f'height="{formula.height}" alt="{alt}" style="vertical-align:middle;" />'
        )
        if block:
            top = _BLOCK_GAP_PX if idx else 0
            return f'<p align="center" style="margin-top:{top}px; margin-bottom:0px;">{img}</p>\n'
        if display:  # $$…$$ amid a paragraph's lines: its own centred line, as LaTeX sets it
            gap = f"margin-top:{_BLOCK_GAP_PX}px; margin-bottom:{_BLOCK_GAP_PX}px;"
            return f'<p align="center" style="{gap}">{img}</p>'
        return img

    return rule


def _build() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
    # "$5 and $6" is money: a $ formula neither starts nor ends beside a space or a digit
    md.use(dollarmath_plugin, allow_space=False, allow_digits=False, double_inline=True)
    md.use(texmath_plugin, delimiters="brackets")
    for kind in ("math_inline", "math_inline_double"):
        md.add_render_rule(kind, _math(kind == "math_inline_double", block=False))
    for kind in ("math_block", "math_block_label", "math_block_eqno"):
        md.add_render_rule(kind, _math(True, block=True))
    md.validateLink = _validate_link
    md.add_render_rule("fence", _fence)
    md.add_render_rule("code_block", _fence)
    md.add_render_rule("code_inline", _code_inline)
    md.add_render_rule("image", _image)
    return md


_MD = _build()
