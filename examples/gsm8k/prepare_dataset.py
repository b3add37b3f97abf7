#!/usr/bin/env python3
"""Write GSM8K training and evaluation rows as `data/train.jsonl` and `data/eval.jsonl`.

Training rows come from the start of GSM8K's train split, evaluation rows from the start of its test split,
so the two never share a problem. Each output line is `{"question": ..., "answer": "... #### N"}`.

    python3 prepare_dataset.py                                  # 200 + 50 rows from the Hugging Face API
    python3 prepare_dataset.py --rows 1000 --eval-rows 200
    python3 prepare_dataset.py --from ~/gsm8k                   # offline: a folder with train.jsonl, test.jsonl
    python3 prepare_dataset.py --from train.jsonl --eval-from test.jsonl

Rows are read from the datasets-server API (at most 100 a request). Every page fetched is kept in
`OUT/.cache/`, so a rerun, or a larger --rows, fetches only what it does not have yet. The API limits the
request rate: the script pauses between requests and, when told to slow down (HTTP 429), waits as long as
the server asks (or backs off exponentially) and tries again.

`--from` takes a local copy instead:
  FOLDER  with train.jsonl and test.jsonl (GSM8K's own layout): train rows from train.jsonl, eval rows from
          test.jsonl, both from the start, like the API.
  FILE    train rows from its start; eval rows from `--eval-from FILE2` if given, else from the END of the same
          file, refused when the two would overlap (an evaluation on training problems measures nothing).
`--eval-from` alone reads eval rows from that file and training rows from the API.

Standard library only, so it runs with any Python 3.8+.
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

API_URL = "https://datasets-server.huggingface.co"
DATASET, CONFIG = "openai/gsm8k", "main"
PAGE = 100  # the API's most rows per request
PAUSE_S = 1.0  # between requests, to stay under the rate limit rather than bounce off it
RETRIES = 6
TIMEOUT_S = 30


class Failure(Exception):
    """A problem the person running the script can fix; printed as one message, exit status 1."""


def main(argv=None):
    args = parse_args(argv)
    try:
        train, train_from = train_rows(args)
        evals, eval_from = eval_rows(args)
        os.makedirs(args.out, exist_ok=True)
        for name, rows, source in (("train", train, train_from), ("eval", evals, eval_from)):
            path = os.path.join(args.out, name + ".jsonl")
            write_jsonl(path, rows)
            print(f"wrote {len(rows)} rows to {path} ({source})")
    except Failure as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the rows fetched so far are cached for the next run", file=sys.stderr)
        return 130
    return 0


def parse_args(argv):
    summary, _, details = __doc__.partition("\n\n")
    p = argparse.ArgumentParser(description=summary, epilog=details,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=positive, default=200, help="training rows (default 200)")
    p.add_argument("--eval-rows", type=positive, default=50, help="evaluation rows (default 50)")
    p.add_argument("--out", default="data", help="output folder (default data/)")
    p.add_argument("--from", dest="source", metavar="PATH",
                   help="local GSM8K: a folder with train.jsonl and test.jsonl, or one .jsonl file")
    p.add_argument("--eval-from", metavar="FILE", help="local .jsonl file for the evaluation rows")
    p.add_argument("--api-url", default=API_URL, help=f"datasets-server base URL (default {API_URL})")
    return p.parse_args(argv)


def positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {value}")
    return value


# --- choosing the sources ----------------------------------------------------------------------------------


def train_rows(args):
    if args.source is None:
        return fetch_rows(args, "train", args.rows), f"GSM8K train[0:{args.rows}] via {args.api_url}"
    if os.path.isdir(args.source):
        path = os.path.join(args.source, "train.jsonl")
        return take(path, 0, args.rows), f"{path} rows 1-{args.rows}"
    return take(args.source, 0, args.rows), f"{args.source} rows 1-{args.rows}"


def eval_rows(args):
    n = args.eval_rows
    if args.eval_from is not None:
        return take(args.eval_from, 0, n), f"{args.eval_from} rows 1-{n}"
    if args.source is None:
        return fetch_rows(args, "test", n), f"GSM8K test[0:{n}] via {args.api_url}"
    if os.path.isdir(args.source):
        path = os.path.join(args.source, "test.jsonl")
        return take(path, 0, n), f"{path} rows 1-{n}"
    rows = read_jsonl(args.source)
    if args.rows + n > len(rows):
        raise Failure(f"{args.source} has {len(rows)} rows, fewer than --rows {args.rows} plus --eval-rows {n}, "
                      f"so training and evaluation rows would overlap: lower them, or pass the test split with "
                      f"--eval-from FILE.")
    return rows[-n:], f"{args.source} rows {len(rows) - n + 1}-{len(rows)} (its last {n})"


# --- local files -------------------------------------------------------------------------------------------


def take(path, start, count):
    rows = read_jsonl(path)
    if len(rows) < start + count:
        raise Failure(f"{path} has {len(rows)} rows, {start + count} are needed: lower --rows / --eval-rows.")
    return rows[start:start + count]


def read_jsonl(path):
    if not os.path.exists(path):
        hint = " (a --from folder must hold train.jsonl and test.jsonl)" if path.endswith(
            ("train.jsonl", "test.jsonl")) else ""
        raise Failure(f"{path} does not exist{hint}.")
    if os.path.isdir(path):
        raise Failure(f"{path} is a folder: pass a .jsonl file, or a folder holding train.jsonl and test.jsonl.")
    try:
        with open(path, encoding="utf-8-sig") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError:
        raise Failure(f"{path} is not UTF-8 text: pass GSM8K as JSON lines.") from None
    except OSError as e:
        raise Failure(f"cannot read {path}: {e.strerror}.") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise Failure(f"{path} line {number} is not JSON ({e.msg} at column {e.colno}); each line must be "
                          f'one object like {{"question": "...", "answer": "... #### 42"}}.') from None
        rows.append(clean(record, f"{path} line {number}"))
    if not rows:
        raise Failure(f"{path} has no rows.")
    return rows


def clean(record, where):
    """Just the question and answer, checked: GSM8K's answer is a reasoning chain ending in `#### N`."""
    if not isinstance(record, dict):
        raise Failure(f"{where}: expected an object with question and answer, got {type(record).__name__}.")
    for key in ("question", "answer"):
        if not isinstance(record.get(key), str):
            raise Failure(f"{where}: needs a string field {key!r}; the row has {', '.join(record) or 'no fields'}.")
    if "####" not in record["answer"]:
        raise Failure(f"{where}: the answer has no '#### N' line, so the reward cannot read its gold number. "
                      f"Is this GSM8K?")
    return {"question": record["question"], "answer": record["answer"]}


def write_jsonl(path, rows):
    # Through a temporary file, so an interrupted run never leaves a half-written dataset to be registered.
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(partial, path)


# --- the datasets-server API -------------------------------------------------------------------------------


def fetch_rows(args, split, count):
    """Rows [0, count) of `split`, from the cache where it has them and from the API where it does not."""
    cache_path = os.path.join(args.out, ".cache", f"gsm8k-{CONFIG}-{split}.jsonl")
    cached = read_cache(cache_path)
    first_request = True
    for offset in range(0, count, PAGE):
        length = min(PAGE, count - offset)
        if all(i in cached for i in range(offset, offset + length)):
            continue
        if not first_request:
            time.sleep(PAUSE_S)
        first_request = False
        page, total = fetch_page(args.api_url, split, offset, length)
        if count > total:
            raise Failure(f"GSM8K's {split} split has {total} rows; asked for {count}: lower "
                          f"{'--rows' if split == 'train' else '--eval-rows'}.")
        append_cache(cache_path, page)
        cached.update(page)
        missing = [i for i in range(offset, offset + length) if i not in cached]
        if missing:
            raise Failure(f"the API returned rows {offset}-{offset + length - 1} of {split} without row {missing[0]}; "
                          f"try again later.")
    return [cached[i] for i in range(count)]


def fetch_page(api_url, split, offset, length):
    """({row index: row}, rows in the split) for one request, retrying politely when rate-limited."""
    query = urllib.parse.urlencode({"dataset": DATASET, "config": CONFIG, "split": split,
                                    "offset": offset, "length": length})
    url = f"{api_url.rstrip('/')}/rows?{query}"
    request = urllib.request.Request(url, headers={"User-Agent": "strop-gsm8k-example/1"})
    for attempt in range(RETRIES + 1):
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                body = json.loads(response.read().decode("utf-8"))
            break
        except urllib.error.HTTPError as e:
            # 429: too many requests; 5xx: the service is busy or restarting. Both pass; anything else will not.
            if (e.code == 429 or e.code >= 500) and attempt < RETRIES:
                wait = retry_after(e)
                wait = 2.0 ** (attempt + 1) if wait is None else wait
                print(f"{url}: HTTP {e.code}; waiting {wait:.0f} s before retry {attempt + 1} of {RETRIES}",
                      file=sys.stderr)
                time.sleep(wait)
                continue
            raise Failure(f"{url} answered HTTP {e.code} {e.reason}{' after retries' if attempt else ''}. "
                          f"Try again later, or pass a local GSM8K copy with --from.") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise Failure(f"cannot reach the datasets-server API at {api_url} ({reason}). Check the network, or "
                          f"prepare the data offline from a local GSM8K copy: --from FOLDER (with train.jsonl and "
                          f"test.jsonl) or --from FILE.") from None
        except ValueError:
            raise Failure(f"{url} did not answer with JSON; is --api-url {api_url} a datasets-server?") from None
    try:
        page = {item["row_idx"]: clean(item["row"], f"{split} row {item['row_idx']}") for item in body["rows"]}
        return page, int(body["num_rows_total"])
    except (KeyError, TypeError):
        raise Failure(f"{url} answered without 'rows' and 'num_rows_total'; is --api-url {api_url} a "
                      f"datasets-server?") from None


def retry_after(error):
    value = error.headers.get("Retry-After") if error.headers else None
    try:
        return min(float(value), 300.0) if value else None
    except ValueError:
        return None  # an HTTP date: rare here, and exponential backoff serves as well


def read_cache(path):
    rows = {}
    if not os.path.exists(path):
        return rows
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                item = json.loads(line)
                rows[item["index"]] = {"question": item["question"], "answer": item["answer"]}
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by an interrupted run: that row is fetched again
    return rows


def append_cache(path, page):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for index in sorted(page):
            f.write(json.dumps({"index": index, **page[index]}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    sys.exit(main())
