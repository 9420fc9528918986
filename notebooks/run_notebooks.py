"""Execute every notebook headless (nbclient) and fail on any cell error (make check-notebooks).

Usage: python run_notebooks.py OUTDIR [NOTEBOOK...]   (default: every notebooks/*.ipynb)
Executed copies go to OUTDIR; the sources are not modified. The data the notebooks read must exist
first (scripts/notebook-data.sh); a plot whose data cannot be produced yet prints SKIPPED and
passes, but an exception in any cell fails the run.
"""
import glob
import os
import sys
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

CELL_TIMEOUT_S = 300   # the heaviest cell reads a few MB of HDF5 and draws; 5 min means hung


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    out = argv[1] if len(argv) > 1 else os.path.join(here, "..", "build", "notebooks")
    books = argv[2:] or sorted(glob.glob(os.path.join(here, "*.ipynb")))
    os.makedirs(out, exist_ok=True)
    failed = []
    for path in books:
        nb = nbformat.read(path, as_version=4)
        t0 = time.time()
        client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                resources={"metadata": {"path": here}})
        try:
            client.execute()
            status = "ok"
        except CellExecutionError as e:
            failed.append(os.path.basename(path))
            status = "FAILED\n" + str(e)
        nbformat.write(nb, os.path.join(out, os.path.basename(path)))
        skips = sum(o.get("text", "").count("SKIPPED") for c in nb.cells if c.cell_type == "code"
                    for o in c.get("outputs", []) if o.get("output_type") == "stream")
        print(f"{os.path.basename(path):<28} {time.time() - t0:5.1f} s  {skips} skipped plot(s)  {status}",
              flush=True)
    print(f"{len(books) - len(failed)} passed, {len(failed)} failed" + (": " + " ".join(failed) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
