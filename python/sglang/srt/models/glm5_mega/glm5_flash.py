"""GLM-5.3-Flash (``Glm5NextForConditionalGeneration``) as the fork resolves it.

Upstream's class, unchanged, until the Flash forward branch lands.
"""

from sglang.srt.models import glm5_next as _upstream


class Glm5NextForConditionalGeneration(_upstream.Glm5NextForConditionalGeneration):
    """GLM-5.3-Flash model."""


EntryClass = [Glm5NextForConditionalGeneration]
