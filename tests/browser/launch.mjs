// Headless Debian Chromium in a throwaway profile, shared by the browser scripts. Page
// errors are collected in `errors`; `close()` ends the browser and removes the profile.
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export async function launch(viewport) {
  const profile = mkdtempSync(join(tmpdir(), "disbatch-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    viewport,
  });
  const page = context.pages()[0] || (await context.newPage());
  // Every wait is for a condition the page reaches; on a loaded machine that takes longer
  // than playwright's 30 s default (a streamed output was seen to), never forever.
  page.setDefaultTimeout(120000);
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  const close = async () => {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  };
  return { context, page, errors, close };
}
