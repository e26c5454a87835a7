"""``python -m trainkit.export``: the entry point of :mod:`trainkit.tools.export` (a MindSpore checkpoint of the
network alone), with a ``.mindir``/``.onnx`` output of :mod:`trainkit.tools.deploy` (a file serving runtimes
load, checked against trainkit's evaluation) and, with ``--to torch`` or a ``.safetensors``/``.pth``/``.pt``
output, of :mod:`trainkit.bridge.export_torch` (a PyTorch state dict under PyTorch's names)."""
import sys
from typing import Optional, Sequence

from trainkit.process.tool_command import importing, tool_status

with importing(__name__):  # python -m: protobuf's C backend, no full collection in the imports
    from trainkit.bridge.export_torch import TORCH_SUFFIXES
    from trainkit.bridge.export_torch import main as torch_main
    from trainkit.tools.deploy import FORMATS
    from trainkit.tools.deploy import main as deploy_main
    from trainkit.tools.export import export_checkpoint  # noqa: F401 - trainkit.export.export_checkpoint, documented
    from trainkit.tools.export import main as mindspore_main


def main(argv: Optional[Sequence[str]] = None) -> int:
    """PyTorch's format when asked for (``--to torch``) or implied by the output's suffix, MindIR or ONNX when the
    output's suffix names one, else a MindSpore checkpoint."""
    argv = list(sys.argv[1:] if argv is None else argv)
    pairs = list(zip(argv, argv[1:]))
    asked = ("--to", "torch") in pairs or "--to=torch" in argv
    implied = any(item.endswith(TORCH_SUFFIXES) and not item.startswith("-") and ("--mapping", item) not in pairs
                  for item in argv)
    mindspore = ("--to", "mindspore") in pairs or "--to=mindspore" in argv
    deploy = any(item.lower().endswith(tuple(FORMATS)) and not item.startswith("-") for item in argv)
    if deploy and not asked:
        return deploy_main(argv)
    return torch_main(argv) if asked or (implied and not mindspore) else mindspore_main(argv)


if __name__ == "__main__":
    sys.exit(tool_status(main))  # a full disk or a signal: one line
