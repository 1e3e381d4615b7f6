// The spectator link: this page's own address with the session's watch URL and watch token in the
// fragment (#watch=…&token=…). A fragment never leaves the browser: it is not sent with the request
// for the page, so the token stays out of server and proxy logs, and browsers strip it from Referer.
// The driver's share control writes the link (share.js); main.js reads it to pick the page's view.

export function spectatorLink(watchUrl, watchToken) {
  const { origin, pathname } = window.location;
  return `${origin}${pathname}#watch=${encodeURIComponent(watchUrl)}&token=${encodeURIComponent(watchToken)}`;
}

// {url, token} when the page was opened with a spectator link, else null. A relative watch URL
// (a server without a public URL) is on the server that served this page.
export function readSpectatorLink(hash = window.location.hash) {
  const params = new URLSearchParams(hash.replace(/^#/, ""));
  const watch = params.get("watch");
  const token = params.get("token");
  if (!watch || !token) return null;
  let url;
  try {
    url = new URL(watch, window.location.href);
  } catch (_) {
    return null;
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return null;
  return { url: url.href, token };
}
