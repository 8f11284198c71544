"""Where a result was measured: the machine description every benchmark JSON records."""
from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def machine_info(**extra: Any) -> dict[str, Any]:
    """CPU model, cores, torch threads and version, GPU (if any), load average at the call; ``extra`` merged in."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "python": platform.python_version(), "torch": torch.__version__,
            "load_average_at_start": list(os.getloadavg()), "platform": platform.platform(), **extra}
