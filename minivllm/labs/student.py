"""Student copies, nbgrader style: solutions replaced by stubs, hidden tests dropped, notebook outputs cleared.

In an exercise file, the lines from `### BEGIN SOLUTION` to `### END SOLUTION` become
`raise NotImplementedError("write <function>: <its docstring's first line>")` at the same indent;
`### BEGIN HIDDEN TESTS` ... `### END HIDDEN TESTS` blocks are dropped (the grader still runs them on each
submission: `hidden_tests` reads them, grader.py runs them). In a notebook code cell, a solution
block keeps its lines with every `NAME = value` assignment turned into `NAME = None  # your prediction`
(e.g. `MY_ANSWER = 6` -> `MY_ANSWER = None  # your prediction`); outputs and execution counts are cleared, and
a Predict lab's "### Why" markdown cell, which explains the answer, becomes a cell asking for the student's own.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
_DEF = re.compile(r"^\s*def (\w+)\(")
_ASSIGN = re.compile(r"^(\s*)([A-Za-z_]\w*)\s*=(?!=).*$")
WHY = "### Why"
WHY_STUDENT = (WHY + "\n*Your explanation: once the check cell says you are right, write here why the engine "
               "gives that value (which step, which formula, which line of the trace).*")


def is_answer_cell(cell) -> bool:
    """A Predict lab's explanation of its answer: a markdown cell whose first line is `### Why`."""
    return cell.cell_type == "markdown" and cell.source.lstrip().split("\n", 1)[0].strip() == WHY


def strip_hidden(lines: list[str]) -> list[str]:
    out, hidden = [], False
    for line in lines:
        if line.strip() == BEGIN_HIDDEN:
            hidden = True
        elif line.strip() == END_HIDDEN:
            hidden = False
        elif not hidden:
            out.append(line)
    return out


def hidden_tests(source: str) -> tuple[str, list[tuple[str, str]]]:
    """An exercise file's hidden tests: (the text of its hidden blocks, [(test name, its docstring's first
    line)]). A hidden test is a `def hidden_test_*()` in a hidden block that calls the lab's function by its
    module-level name and raises AssertionError when the result is wrong; the grader runs each one on a
    submission (grader.py), and the student copy has none of them."""
    block, hidden = [], False
    for line in source.splitlines():
        if line.strip() in (BEGIN_HIDDEN, END_HIDDEN):
            hidden = line.strip() == BEGIN_HIDDEN
        elif hidden:
            block.append(line)
    text = "\n".join(block)
    tests = [(node.name, (ast.get_docstring(node) or node.name).split("\n")[0]) for node in ast.parse(text).body
             if isinstance(node, ast.FunctionDef) and node.name.startswith("hidden_test_")]
    return text, tests


def stub_source(source: str) -> str:
    """An exercise file's student copy: each solution block -> raise NotImplementedError naming its function."""
    lines, out, in_solution = strip_hidden(source.splitlines()), [], False
    func, doc = "this function", ""
    for i, line in enumerate(lines):
        if m := _DEF.match(line):
            func, doc = m.group(1), _first_doc_line(lines, i)
        if line.strip() == BEGIN:
            in_solution = True
            indent = line[:len(line) - len(line.lstrip())]
            out.append(f'{indent}raise NotImplementedError("write {func}: {doc}")')
        elif line.strip() == END:
            in_solution = False
        elif not in_solution:
            out.append(line)
    return "\n".join(out) + "\n"


def _first_doc_line(lines: list[str], def_index: int) -> str:
    for line in lines[def_index + 1:def_index + 4]:
        text = line.strip().strip('"').strip()
        if text:
            return text.replace('"', "'").replace("\\", "")
    return "see the docstring"


def stub_cell(source: str) -> str:
    """A notebook cell's student copy: inside a solution block, `NAME = value` -> `NAME = None  # your prediction`."""
    out, in_solution = [], False
    for line in strip_hidden(source.split("\n")):
        if line.strip() == BEGIN:
            in_solution = True
        elif line.strip() == END:
            in_solution = False
        elif in_solution and (m := _ASSIGN.match(line)):
            out.append(f"{m.group(1)}{m.group(2)} = None  # your prediction")
        elif not in_solution:
            out.append(line)
    return "\n".join(out)


def write_student_copies(dest: str | Path, exercises: Path, notebooks: Path | None) -> list[Path]:
    """Write exercises/*.py and notebooks/*.ipynb student copies under `dest`; return the files written."""
    dest, written = Path(dest), []
    (dest / "exercises").mkdir(parents=True, exist_ok=True)
    for path in sorted(exercises.glob("lab*.py")):
        target = dest / "exercises" / path.name
        target.write_text(stub_source(path.read_text()))
        written.append(target)
    if notebooks is not None and notebooks.is_dir():
        import nbformat
        (dest / "notebooks").mkdir(exist_ok=True)
        for path in sorted(notebooks.glob("*.ipynb")):
            nb = nbformat.read(path, as_version=4)
            for cell in nb.cells:
                if is_answer_cell(cell):
                    cell.source = WHY_STUDENT
                if cell.cell_type == "code":
                    cell.source = stub_cell(cell.source)
                    cell.outputs, cell.execution_count = [], None
            target = dest / "notebooks" / path.name
            nbformat.write(nb, target)
            written.append(target)
    return written
