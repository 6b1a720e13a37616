#!/usr/bin/env bash
# Runs THERE, on a GPU machine without transformers or huggingface_hub (no package registry):
# `mlx_lm.generate` imports them at the top (its tokenizer wrapper and downloader), though
# `generate_step`, which `stoke bench engines` times, uses neither. If they cannot be
# imported, writes stand-ins holding just the names mlx-lm imports to ${1:-/tmp/shim}; put
# that folder LAST on PYTHONPATH. Nothing that runs calls them: a call raises.
set -euo pipefail
shim=${1:-/tmp/shim}
python3 -c "import transformers, huggingface_hub" 2>/dev/null && exit 0
mkdir -p "$shim/transformers" "$shim/huggingface_hub"
cat > "$shim/transformers/__init__.py" <<'PY'
"""Stand-in names for mlx-lm's imports on a machine without transformers (bench/device)."""


class _Absent:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("transformers is not installed on this machine")

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        raise RuntimeError("transformers is not installed on this machine")

    @classmethod
    def register(cls, *args, **kwargs):
        """mlx-lm registers its own tokenizer classes at import."""


AutoTokenizer = PreTrainedTokenizer = PreTrainedTokenizerFast = _Absent
AutoConfig = AutoProcessor = _Absent
PY
cat > "$shim/transformers/tokenization_utils_base.py" <<'PY'
from transformers import _Absent as PreTrainedTokenizerBase  # noqa: F401
PY
cat > "$shim/huggingface_hub/__init__.py" <<'PY'
"""Stand-in names for mlx-lm's imports on a machine without huggingface_hub (bench/device)."""


def _absent(*args, **kwargs):
    raise RuntimeError("huggingface_hub is not installed on this machine")


snapshot_download = hf_hub_download = upload_folder = _absent


class HfApi:
    def __init__(self, *args, **kwargs):
        _absent()


ModelCard = ModelCardData = logging = None
PY
echo "transformers / huggingface_hub stand-ins in $shim"
