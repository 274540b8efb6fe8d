// A blob saved as a file under `name`, through a link the page clicks for the person.
export function saveBlob(blob, name) {
  const href = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = href;
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(href), 10000);
}

// A result saved under `name`. Read back as a blob: a link's `download` is ignored for
// another origin (S3's presigned URLs), where following it would leave the page; where
// it cannot be read, it opens in a new tab.
export async function download(url, name) {
  try {
    const response = await fetch(url);
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    saveBlob(await response.blob(), name);
  } catch {
    window.open(url, "_blank", "noopener");
  }
}
