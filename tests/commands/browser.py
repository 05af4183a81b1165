"""Rendering an HTML report in a real browser (headless Chromium), for the report tests."""

import shutil
import subprocess
from pathlib import Path

from readiness import LIMIT_S


def assert_renders_in_chromium(page: Path, tmp_path: Path) -> None:
    """Screenshot ``page`` in headless Chromium and assert the image is not blank (> 50 kB); skipped
    silently where no Chromium is installed."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium:
        shot = tmp_path / "page.png"
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--window-size=1280,2400",
                f"--screenshot={shot}",
                page.as_uri(),
            ],
            capture_output=True,
            timeout=LIMIT_S,
            check=True,
        )
        assert shot.stat().st_size > 50_000
