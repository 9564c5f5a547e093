"""What every browser test shares: Debian's Chromium under Playwright, one per test module (the
`browser` fixture, registered in conftest), and screenshots in build/screenshots/, where the
README's come from (look at them)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.server import CHROMIUM, CHROMIUM_ARGS, ROOT, browser_or_skip, password

SHOTS = ROOT / "build" / "screenshots"


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium for the module (skipped where Chromium or Playwright is missing)."""
    sync_api = browser_or_skip()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def shoot(page, name: str, full: bool = False) -> Path:
    """A PNG of the page (the whole scrolled page with `full`), checked not to be blank."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full)
    assert path.stat().st_size > 10_000, f"{path} is suspiciously small"
    return path


def login(page, base: str, name: str) -> None:
    """Log in through the /login form; the page lands on /jobs."""
    page.goto(base + "/login")
    page.fill("#login-user", name)
    page.fill("#login-password", password(name))
    page.click("#login-submit")
    page.wait_for_url(re.compile(r".*/jobs$"), timeout=15_000)
    page.wait_for_function(
        f"() => (document.querySelector('#nav-user')?.innerText || '').includes('{name} (')", timeout=15_000)
