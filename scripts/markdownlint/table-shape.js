// gpugate's own markdownlint rule: a table whose delimiter row has another
// number of cells than its header row is no table to GitHub (GFM shows its
// lines as text), and markdownlint's table rules never see it.  Also a body
// row with more cells than the header (GFM drops the extra cells).
"use strict";

const DELIMITER = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

function cells(line) {
  let text = line.trim();
  if (text.startsWith("|")) text = text.slice(1);
  if (text.endsWith("|") && !text.endsWith("\\|")) text = text.slice(0, -1);
  // Cells split at every pipe not escaped with a backslash (GFM splits inside code spans too).
  return text.split(/(?<!\\)\|/).length;
}

module.exports = {
  names: ["GG001", "table-shape"],
  description: "Table rows must have as many cells as the header row",
  tags: ["table"],
  parser: "none",
  function: function rule(params, onError) {
    const lines = params.lines;
    let fence = null;
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      const opening = line.match(/^\s*(`{3,}|~{3,})/);
      if (opening) {
        if (fence === null) fence = opening[1];
        else if (line.trim().startsWith(fence)) fence = null;
        continue;
      }
      if (fence !== null || i === 0 || !line.includes("|") || !DELIMITER.test(line)) continue;
      const header = lines[i - 1];
      if (!header.includes("|")) continue;
      const want = cells(header);
      const got = cells(line);
      if (got !== want) {
        onError({ lineNumber: i + 1, detail: "delimiter row has " + got + " cells, header row " + want +
                  " (GitHub does not render it as a table)" });
        continue;
      }
      for (let j = i + 1; j < lines.length && lines[j].includes("|") && lines[j].trim() !== ""; j++) {
        const n = cells(lines[j]);
        if (n > want) {
          onError({ lineNumber: j + 1, detail: "row has " + n + " cells, header row " + want });
        }
      }
    }
  },
};
