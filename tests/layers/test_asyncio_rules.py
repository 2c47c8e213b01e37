"""Rules for asyncio code in what ships (node/, client/, ops/), checked on the source text."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = ("node", "client", "ops")


def _calls_to(attr: str, owner: str):
    for top in SHIPPED:
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), path)
                for node in ast.walk(tree):
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                            and node.func.attr == attr and isinstance(node.func.value, ast.Name) \
                            and node.func.value.id == owner:
                        yield f"{os.path.relpath(path, ROOT)}:{node.lineno}"


def test_no_asyncio_wait_for():
    # Python 3.11's wait_for() swallows a cancellation that arrives as the awaited
    # operation completes (CPython gh-86296, fixed in 3.12): a peer link cancelled by
    # close() just as its handshake finished went on to pump forever, and close()
    # waited for it (a CI hang). `async with asyncio.timeout(t):` cancels correctly.
    assert list(_calls_to("wait_for", "asyncio")) == []
