// Building DOM nodes and patching a tree in place: a refresh updates the
// nodes that changed and keeps the rest (their focus, scroll, typed text),
// so the page never flickers. Rows carry `data-key` so a row is reused only
// for the same job, queue or schedule.

/** An element: h("a", {href: "#"}, "text", child, [children]). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === false || v === null || v === undefined) continue;
    el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Makes `parent`'s children look like `next` (nodes; nulls and nested
 * arrays allowed, as `h` takes them), reusing the nodes it can. */
export function patch(parent, next) {
  next = next.flat(Infinity).filter((n) => n !== null && n !== undefined && n !== false);
  const old = Array.from(parent.childNodes);
  next.forEach((n, i) => {
    const o = old[i];
    if (!o) parent.appendChild(n);
    else if (sameKind(o, n)) update(o, n);
    else parent.replaceChild(n, o);
  });
  for (let i = next.length; i < old.length; i++) old[i].remove();
}

function sameKind(o, n) {
  if (o.nodeType !== n.nodeType || o.nodeName !== n.nodeName) return false;
  return o.nodeType !== Node.ELEMENT_NODE || o.getAttribute("data-key") === n.getAttribute("data-key");
}

function update(o, n) {
  if (o.nodeType !== Node.ELEMENT_NODE) {
    if (o.nodeValue !== n.nodeValue) o.nodeValue = n.nodeValue;
    return;
  }
  for (const a of Array.from(o.attributes)) {
    if (!n.hasAttribute(a.name)) o.removeAttribute(a.name);
  }
  for (const a of Array.from(n.attributes)) {
    if (o.getAttribute(a.name) !== a.value) o.setAttribute(a.name, a.value);
  }
  // What the user typed stays: only the attribute follows the data.
  patch(o, Array.from(n.childNodes));
}

/** Geometry the CSP forbids as style attributes, set through the CSSOM. */
export function placeBars(root) {
  for (const el of root.querySelectorAll("[data-left]")) {
    el.style.left = `${el.getAttribute("data-left")}%`;
    el.style.width = `${el.getAttribute("data-width")}%`;
  }
}
