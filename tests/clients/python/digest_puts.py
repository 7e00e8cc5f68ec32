"""PUT documents of 100 KB with Python requests and Digest, each on a fresh session: the
first attempt goes without credentials, gets the 401 challenge before its body is read, and
the session resends on the same connection. Prints a JSON summary; exits 0."""

import json
import sys

import requests
from requests.auth import HTTPDigestAuth

base, user, password, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
body = json.dumps({"pad": "x" * (100 * 1024)})
errors = []
statuses = {}
for i in range(count):
    with requests.Session() as session:
        session.auth = HTTPDigestAuth(user, password)
        try:
            r = session.put(
                f"{base}/v1/documents",
                params={"uri": f"/py/{i}.json"},
                data=body,
                headers={"Content-Type": "application/json"},
                timeout=30,
            )
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code not in (201, 204):
                errors.append(f"{i}: {r.status_code} {r.text[:200]}")
        except requests.RequestException as e:
            errors.append(f"{i}: {type(e).__name__}: {e}")
print(json.dumps({"puts": count, "statuses": statuses, "errors": errors}))
