"""Documents of the ``anchored_gsm8k_cot`` lm-eval task: the GSM8K test split as this library loads it, each with
the library's ``cot`` prompt text (``prompt``) and the gold number (``answer``), so lm-eval and
``anchored-reasoning eval`` see the same questions in the same words."""
from __future__ import annotations

from typing import Any


def load_docs(**_: Any) -> dict[str, Any]:
    """``{"test": Dataset}`` of ``{"id", "prompt", "answer"}`` rows, in the split's order. lm-eval passes the task's
    metadata (and model args) as keywords; none change the documents."""
    import datasets

    from anchored_reasoning.eval.methods import build_method
    from anchored_reasoning.tasks import get_task

    task, method = get_task("gsm8k"), build_method("cot")
    rows = [{"id": str(e.id), "prompt": method.prompt(e, task).text, "answer": e.answer} for e in task.load("test")]
    return {"test": datasets.Dataset.from_list(rows)}
