#!/usr/bin/env bash
# Checks the relative links of the documentation, without the network: every markdown link
# `[text](path)` or `[text](path#anchor)` in README.md, docs/**/*.md, webhook/README.md,
# charts/**/README.md, tests/README.md and lincheck/README.md must name a file or folder that
# exists, and an anchor must name a heading of the markdown file it points to (GitHub's rule:
# lower case, punctuation dropped, spaces to hyphens, `-1`, `-2` for repeated headings).
# Links with a scheme (https:, mailto:) are not checked. Exit 1 when any link is broken, each
# listed as FILE:LINE: TARGET (why).
#
#   hack/check-doc-links.sh            the files above
#   hack/check-doc-links.sh FILE...    only these files
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if (($#)); then
  files=("$@")
else
  files=(README.md webhook/README.md tests/README.md lincheck/README.md)
  while IFS= read -r f; do files+=("$f"); done < <(find docs charts -name '*.md' -type f | sort)
fi

# The anchors of a markdown file, one a line (headings outside fenced code).
anchors() {
  awk '
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    /^#+[ \t]/ {
      h = $0
      sub(/^#+[ \t]+/, "", h); sub(/[ \t]+#*[ \t]*$/, "", h)
      h = tolower(h)
      gsub(/[^a-z0-9 _-]/, "", h)   # GitHub drops punctuation (and symbols such as ≈)
      gsub(/ /, "-", h)
      n = seen[h]++
      print (n ? h "-" n : h)
    }
  ' "$1"
}

broken=0
for file in "${files[@]}"; do
  [[ -f "$file" ]] || { echo "$file: no such file" >&2; broken=$((broken + 1)); continue; }
  dir="$(dirname "$file")"
  # FILE-LINE and TARGET of every inline link outside fenced code.
  while IFS=$'\t' read -r line target; do
    [[ -z "$target" ]] && continue
    case "$target" in
      *://* | mailto:*) continue ;;
    esac
    path="${target%%#*}"
    anchor=""
    [[ "$target" == *"#"* ]] && anchor="${target#*#}"
    if [[ -z "$path" ]]; then
      resolved="$file"
    else
      resolved="$dir/$path"
    fi
    if [[ ! -e "$resolved" ]]; then
      echo "$file:$line: $target (no such file: $resolved)" >&2
      broken=$((broken + 1))
      continue
    fi
    if [[ -n "$anchor" && -f "$resolved" && "$resolved" == *.md ]]; then
      if ! anchors "$resolved" | grep -qxF -- "$anchor"; then
        echo "$file:$line: $target (no heading for #$anchor in $resolved)" >&2
        broken=$((broken + 1))
      fi
    fi
  done < <(awk '
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    {
      s = $0
      gsub(/`[^`]*`/, "", s)          # links inside code spans are not links
      while (match(s, /\]\([^)[:space:]]+\)/)) {
        t = substr(s, RSTART + 2, RLENGTH - 3)
        print NR "\t" t
        s = substr(s, RSTART + RLENGTH)
      }
    }
  ' "$file")
done

if ((broken)); then
  echo "check-doc-links: $broken broken link(s) in ${#files[@]} files" >&2
  exit 1
fi
echo "check-doc-links: every relative link of ${#files[@]} files resolves"
