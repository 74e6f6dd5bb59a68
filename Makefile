# The two commands of the README:
#   make book      -> builds the HTML book (executing every notebook once, on every core) into _build/html
#   make test      -> unit tests of fedlab + nbval over every notebook in chapters/, on every core
# and for contributors (CONTRIBUTING.md):
#   make test-fast -> the unit tests without notebooks, Ray or deployment (markers notebook, flower, slow)
# Both create .venv on first use and reuse it afterwards.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-stamp
# One intra-op thread: the course's models are tiny, and two processes with two spinning OpenMP
# threads each on a 2-core machine run several times slower than one thread each (measured).
RUNENV  = FEDLAB_PROGRESS=0 OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1}

.PHONY: book test test-fast venv clean screenshots pdf

# pytest-xdist workers (and notebooks executed at once by `make book`): every core unless JOBS is set.
# A worker more than the cores (to fill the waits of Ray, Flower and the timeout tests) was measured on 2 cores:
# `make test` 341 s and 409 s with 3 workers against 389 s and 389 s with 2 (fresh clones, 2026-11-27), and
# `make test-fast` 91 s against 75 s: not a clear gain, so one worker a core. `make test JOBS=3` tries it.
JOBS   ?= auto
TEST_JOBS = $(JOBS)
PYTEST  = $(RUNENV) FEDLAB_SCALE=$${FEDLAB_SCALE:-quick} $(PY) -m pytest -q

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[book,test,flower]"
	touch $(STAMP)

book: $(STAMP)
	$(RUNENV) FEDLAB_SCALE=$${FEDLAB_SCALE:-quick} $(PY) scripts/execute_notebooks.py $(if $(filter-out auto,$(JOBS)),--jobs $(JOBS))
	$(RUNENV) FEDLAB_SCALE=$${FEDLAB_SCALE:-quick} $(VENV)/bin/jupyter-book build . --all -W --keep-going
	@echo "Book built: open $(CURDIR)/_build/html/index.html"

# notebooks first: they are the longest items, so the workers start on them and the unit tests fill in;
# --dist loadfile keeps each notebook's cells (one kernel) on one worker; --keep-executed stores each notebook
# that passed, executed, so that `make book` right after reuses it (same fedlab, records and environment:
# scripts/executed_store.py) and CI runs every notebook once
# The deployment test (tests/test_flower_deploy.py) spends 3-5 minutes of wall but about 90 s of CPU: most of it
# waits on Flower's SuperLink/SuperNode polling. Inside the xdist pool it held a worker (a core) idle for those
# minutes; here it runs as its own pytest process beside the pool, its output shown after the pool's, and
# `make test` fails if either fails.
DEPLOY_TEST = tests/test_flower_deploy.py
test: $(STAMP)
	@mkdir -p _build
	@$(PYTEST) -p no:cacheprovider $(DEPLOY_TEST) > _build/deploy-test.log 2>&1 & deploy=$$!; \
	$(PYTEST) -n $(TEST_JOBS) --dist loadfile chapters/ tests/ --ignore $(DEPLOY_TEST) --nbval-lax --nbval-current-env \
	  --keep-executed _build/executed; pool=$$?; \
	wait $$deploy; dep=$$?; echo "--- $(DEPLOY_TEST), run beside the pool:"; cat _build/deploy-test.log; \
	test $$pool -eq 0 -a $$dep -eq 0

test-fast: $(STAMP)
	$(PYTEST) -n $(JOBS) --dist load tests/ -m "not notebook and not flower and not slow"

# the whole book as one PDF (executes every notebook; needs XeLaTeX and latexmk, e.g. Debian's
# texlive-latex-extra texlive-xetex texlive-fonts-extra fonts-freefont-otf latexmk xindy)
pdf: $(STAMP)
	$(RUNENV) FEDLAB_SCALE=$${FEDLAB_SCALE:-quick} $(VENV)/bin/jupyter-book build . --builder pdflatex
	@echo "PDF: $(CURDIR)/_build/latex/fedlab-course.pdf"

# headless Chromium over every built page (run `make book` first): one PNG per page in _build/screenshots/
screenshots:
	test -f _build/html/index.html || { echo "build the book first: make book"; exit 1; }
	mkdir -p _build/screenshots
	for page in _build/html/index.html _build/html/chapters/*.html _build/html/book/*.html; do \
	  scripts/screenshot.sh "$$page" "_build/screenshots/$$(basename "$$page" .html).png" 4000 >/dev/null || exit 1; \
	done
	@echo "Screenshots in $(CURDIR)/_build/screenshots"

clean:
	rm -rf _build
