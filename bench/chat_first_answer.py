"""A person's first chat answer on a running Temper, end to end over HTTP: log in, open a new conversation
with the project's first chat model (its page asks the serve worker to load the model), wait, send a
message, and read the answer's row once it is done: its time to first token (measured by the serve
worker from the request's arrival) and the time from sending to the answer's end.

    TEMPER_SERVE_WARMUP=0 TEMPER_PORT=8799 TEMPER_DATA=/tmp/var bash scripts/up.sh &   # or =1
    .venv/bin/python bench/chat_first_answer.py --url http://127.0.0.1:8799 --password PW --data /tmp/var --wait 20

Reads the row from the stack's SQLite database (``--data``/temper.sqlite3). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import re
import sqlite3
import time
from pathlib import Path

import httpx2 as httpx  # the HTTP client the openai package brings

CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--user", default="admin")
    parser.add_argument("--password", required=True)
    parser.add_argument("--project", default="demo")
    parser.add_argument("--data", required=True, help="the stack's TEMPER_DATA (its SQLite database is read)")
    parser.add_argument("--wait", type=float, default=20.0, help="seconds between opening the conversation and sending")
    parser.add_argument("--message", default="What is 17 + 25?")
    args = parser.parse_args()
    client = httpx.Client(base_url=args.url, follow_redirects=True, timeout=120)
    login = client.get("/accounts/login/")
    client.post("/accounts/login/", data={"username": args.user, "password": args.password,
                                          "csrfmiddlewaretoken": CSRF.search(login.text).group(1)},
                headers={"Referer": f"{args.url}/accounts/login/"})
    chat_url = f"/p/{args.project}/chat/"
    page = client.get(chat_url).text
    form = {name: value for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)}
    model = re.search(r'<option value="([^"]+)"', page).group(1)
    form.update(model=model, system_prompt="", temperature="0.7", top_p="1", top_k="0", max_tokens="256")
    detail = client.post(chat_url, data=form, headers={"Referer": f"{args.url}{chat_url}"})
    time.sleep(args.wait)
    token = CSRF.search(detail.text).group(1)
    send_url = re.search(r'data-send="([^"]+)"', detail.text).group(1)
    sent = time.monotonic()
    answer = client.post(send_url, data={"content": args.message, "csrfmiddlewaretoken": token},
                         headers={"Referer": str(detail.url), "X-CSRFToken": token}).json()["message"]
    database = sqlite3.connect(Path(args.data) / "temper.sqlite3")
    while True:
        row = database.execute("select status, first_token_seconds, completion_tokens from chat_message "
                               "where public_id = ?", (answer,)).fetchone()
        if row and row[0] != "streaming":
            break
        time.sleep(0.05)
    print(json.dumps({"model": model, "wait_seconds": args.wait, "status": row[0],
                      "first_token_seconds": round(row[1], 3) if row[1] is not None else None,
                      "completion_tokens": row[2], "answer_done_seconds": round(time.monotonic() - sent, 2)}))


if __name__ == "__main__":
    main()
