// The little Markdown the API's descriptions use, built as DOM nodes: paragraphs (a blank
// line between), `- ` lists, `code` spans and **bold**. Everything else, markup included, stays
// the characters it is made of: no string is ever parsed as HTML.

import { h } from '/ui/js/dom.js';

// A code span (a run of backticks closed by a run of the same length), or **bold**.
const INLINE = /(?<!`)(`+)(?!`)([\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]*?\S)\*\*/g;

/** Inline Markdown: text nodes, `<code>` and `<strong>`; a line break is a space. */
export function inline(text) {
  const source = String(text ?? '');
  const nodes = [];
  const plain = (s) => { if (s) nodes.push(document.createTextNode(s.replace(/\s*\n\s*/g, ' '))); };
  let at = 0;
  for (const m of source.matchAll(INLINE)) {
    plain(source.slice(at, m.index));
    if (m[1]) {
      // As CommonMark: line breaks become spaces, one space each side is padding.
      let code = m[2].replace(/\n/g, ' ');
      if (/^ .*[^ ].* $/.test(code)) code = code.slice(1, -1);
      nodes.push(h('code', { text: code }));
    } else {
      nodes.push(h('strong', {}, inline(m[3])));
    }
    at = m.index + m[0].length;
  }
  plain(source.slice(at));
  return nodes;
}

/** Block Markdown: a `<p>` per paragraph, a `<ul>` for lines that start with `- ` or `* `. */
export function markdown(text) {
  const blocks = String(text ?? '').trim().split(/\n[ \t]*\n/).filter((b) => b.trim());
  return blocks.map((block) => {
    const lines = block.split('\n');
    if (/^\s*[-*] /.test(lines[0])) {
      const items = [];
      for (const line of lines) {
        if (/^\s*[-*] /.test(line)) items.push(line.replace(/^\s*[-*] /, ''));
        else items[items.length - 1] += `\n${line}`;
      }
      return h('ul', {}, items.map((item) => h('li', {}, inline(item))));
    }
    return h('p', {}, inline(block.trim()));
  });
}
