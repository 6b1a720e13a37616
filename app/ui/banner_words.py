"""Banners whose words change when their cause is resolved, not only disappear.

The engine host says "... Restarting it." when the engine dies; once it is ready again the
window must not keep saying so (issue 16). A banner only about the restart goes; a turn's
crash banner keeps its advice (the reply can be continued) in the past tense.
"""

from __future__ import annotations

from app.ui.banner import Banner

RESTARTING = " Restarting it."
RESTARTED = " Stoke restarted it."


def restarted(banner: Banner) -> None:
    """The engine is ready again: update or take down what said it was restarting."""
    if banner.isHidden():
        return
    if banner.cause == "restart":
        banner.hide()
    elif banner.cause == "crash-turn" and RESTARTING in banner.text.text():
        banner.show_message(
            banner.text.text().replace(RESTARTING, RESTARTED),
            kind=banner.kind,
            cause=banner.cause,
            conversation=banner.conversation,
        )
