/**
 * Hostile-input-safe XML reading.
 * - {@link parseOrderedXml}, the front half every XML reader of the project shares (this file's
 *   tree and the namespace-resolving OVF reader of `ovf.ts`): DOCTYPE is refused (so no entity
 *   can be declared, let alone expanded), the text must be well-formed, fast-xml-parser runs with
 *   entity processing off, and names `__proto__`, `constructor`, `prototype` are marked for the
 *   tree builders to drop.
 * - {@link parseXmlDocument}, a small tree for the settings formats read without namespaces
 *   (VirtualBox `.vbox`, XenServer `ova.xml`): entities other than XML's five predefined ones
 *   and character references are refused, attributes live in null-prototype maps.
 */
import { XMLParser, XMLValidator } from 'fast-xml-parser'
import { malformed } from './io.ts'

/** Default largest XML text accepted, bytes (4 MiB). */
export const MAX_XML_BYTES = 4 * 1024 * 1024
/** Deepest element nesting accepted. */
export const MAX_XML_DEPTH = 256
/**
 * Most elements accepted in one document (counted before any tree is built; a
 * real OVF envelope or `.vbox` has a few thousand at most, a hostile 1 MB one 200 000).
 */
export const MAX_XML_ELEMENTS = 50_000

/** Number of start tags (`<` followed by a name character) in `xml`. */
export function countXmlElements(xml: string): number {
  let n = 0
  for (let i = xml.indexOf('<'); i >= 0 && i < xml.length - 1; i = xml.indexOf('<', i + 1)) {
    const c = xml.charCodeAt(i + 1)
    if (c !== 0x2f && c !== 0x21 && c !== 0x3f) n++ // not '/', '!', '?'
  }
  return n
}

/**
 * One XML element: `name` is the local name (namespace prefix dropped), `attrs` a null-prototype
 * map of local attribute names to decoded values, `children` the child elements in document order,
 * `text` the decoded character data directly inside the element (concatenated, untrimmed).
 */
export interface XmlNode {
  name: string
  attrs: Map<string, string>
  children: XmlNode[]
  text: string
}

/** Element and attribute names never copied into a tree (prototype pollution). */
export const UNSAFE_NAMES: ReadonlySet<string> = new Set(['__proto__', 'constructor', 'prototype'])
/** Prefix {@link parseOrderedXml} puts before an unsafe name; tree builders skip such names. */
export const UNSAFE_MARK = '#unsafe:'
const PREDEFINED_ENTITIES = new Map([
  ['amp', '&'],
  ['lt', '<'],
  ['gt', '>'],
  ['quot', '"'],
  ['apos', "'"],
])

/**
 * Decodes XML's five predefined entities and character references in attribute values and text
 * (entity processing is off in the parser, and no DTD is ever read); an undefined entity, a bare
 * `&` or a reference to no character is `E_MIG_MALFORMED_ARCHIVE`.
 */
export function decodeXmlText(s: string, label: string): string {
  if (!s.includes('&')) return s
  return s.replace(/&([^;&\s]{0,32});?/g, (m, ref: string) => {
    if (!m.endsWith(';')) throw malformed(label, `bare '&' in XML text`)
    let cp = NaN
    if (/^#x[0-9a-fA-F]{1,6}$/.test(ref)) cp = parseInt(ref.slice(2), 16)
    else if (/^#[0-9]{1,7}$/.test(ref)) cp = parseInt(ref.slice(1), 10)
    else {
      const v = PREDEFINED_ENTITIES.get(ref)
      if (v === undefined) throw malformed(label, `undefined entity &${ref};`)
      return v
    }
    if (!(cp > 0 && cp <= 0x10ffff) || (cp >= 0xd800 && cp <= 0xdfff)) throw malformed(label, `bad character reference &${ref};`)
    return String.fromCodePoint(cp)
  })
}

function localName(q: string): string {
  const i = q.indexOf(':')
  return i < 0 ? q : q.slice(i + 1)
}

function buildXmlTree(nodes: unknown[], label: string, depth: number, budget: { left: number }): XmlNode[] {
  if (depth > MAX_XML_DEPTH) throw malformed(label, 'XML nested too deeply')
  const out: XmlNode[] = []
  for (const node of nodes) {
    if (!node || typeof node !== 'object') continue
    const keys = Object.keys(node).filter((k) => k !== ':@' && k !== '#text')
    if (keys.length !== 1) continue
    const qname = keys[0]!
    if (qname.startsWith(UNSAFE_MARK) || qname.startsWith('?') || qname.startsWith('!')) continue
    const name = localName(qname)
    if (UNSAFE_NAMES.has(name)) continue
    if (--budget.left < 0) throw malformed(label, 'too many XML elements')
    const attrs = new Map<string, string>()
    const rawAttrs = (node as Record<string, unknown>)[':@']
    if (rawAttrs && typeof rawAttrs === 'object') {
      for (const [k, v] of Object.entries(rawAttrs as Record<string, unknown>)) {
        if (typeof v !== 'string' || k.startsWith(UNSAFE_MARK)) continue
        const ln = localName(k)
        if (UNSAFE_NAMES.has(ln) || k === 'xmlns' || k.startsWith('xmlns:')) continue
        attrs.set(ln, decodeXmlText(v, label))
      }
    }
    const kids = (node as Record<string, unknown>)[qname]
    let text = ''
    let children: XmlNode[] = []
    if (Array.isArray(kids)) {
      for (const k of kids) {
        const t = k && typeof k === 'object' ? (k as Record<string, unknown>)['#text'] : undefined
        if (typeof t === 'string' || typeof t === 'number') text += decodeXmlText(String(t), label)
      }
      children = buildXmlTree(kids, label, depth + 1, budget)
    }
    out.push({ name, attrs, children, text })
  }
  return out
}

/**
 * Checks XML text and parses it into fast-xml-parser's ordered form (`preserveOrder`: an array
 * of `{ <qname>: children, ':@': attributes }` and `{ '#text': … }` nodes; attribute values and
 * text undecoded, since entity processing is off). Element and attribute names whose local part
 * is unsafe come back behind {@link UNSAFE_MARK}. `trim`: trim text values; `cdata`: keep CDATA
 * sections under `#cdata` (else as text); `maxNestedTags`: the parser's own nesting limit.
 * `E_MIG_MALFORMED_ARCHIVE` (`<label>: <reason>`): a DOCTYPE or ENTITY declaration, XML that is
 * not well-formed.
 */
export function parseOrderedXml(xml: string, label: string, opts: { trim?: boolean; cdata?: boolean; maxNestedTags?: number } = {}): unknown[] {
  if (/<!DOCTYPE/i.test(xml) || /<!ENTITY/i.test(xml)) throw malformed(label, 'DOCTYPE/ENTITY declarations are not allowed')
  const elements = countXmlElements(xml)
  if (elements > MAX_XML_ELEMENTS) throw malformed(label, `${elements} XML elements, more than the ${MAX_XML_ELEMENTS} accepted`)
  const v = XMLValidator.validate(xml, { allowBooleanAttributes: false })
  if (v !== true) throw malformed(label, `not well-formed XML: ${v.err.msg} (line ${v.err.line}, column ${v.err.col})`)
  const rename = (n: string): string => (UNSAFE_NAMES.has(n) || UNSAFE_NAMES.has(localName(n)) ? UNSAFE_MARK + n : n)
  const parser = new XMLParser({
    preserveOrder: true,
    ignoreAttributes: false,
    attributeNamePrefix: '',
    parseTagValue: false,
    parseAttributeValue: false,
    processEntities: false,
    htmlEntities: false,
    trimValues: opts.trim ?? false,
    ignoreDeclaration: true,
    ignorePiTags: true,
    commentPropName: false,
    ...(opts.cdata ? { cdataPropName: '#cdata' } : {}),
    ...(opts.maxNestedTags ? { maxNestedTags: opts.maxNestedTags } : {}),
    transformTagName: rename,
    transformAttributeName: rename,
  })
  try {
    const raw: unknown = parser.parse(xml)
    return Array.isArray(raw) ? raw : []
  } catch (e) {
    throw malformed(label, `not well-formed XML: ${(e as Error).message}`)
  }
}

/**
 * Parses XML text into an {@link XmlNode} tree and returns the root element.
 *
 * Refuses (E_MIG_MALFORMED_ARCHIVE, message `<label>: <reason>`): text over `maxBytes` (default
 * 4 MiB), any `<!DOCTYPE` or `<!ENTITY` (no DTD is ever processed), XML that is not well-formed,
 * undefined entities, nesting deeper than 256, more than 200 000 elements, zero or several roots.
 * CDATA sections are kept as text; comments and processing instructions are dropped.
 */
export function parseXmlDocument(xml: string, label: string, maxBytes = MAX_XML_BYTES): XmlNode {
  if (Buffer.byteLength(xml, 'utf8') > maxBytes) throw malformed(label, `XML larger than ${maxBytes} bytes`)
  const roots = buildXmlTree(parseOrderedXml(xml, label), label, 0, { left: 200_000 })
  if (roots.length !== 1) throw malformed(label, `expected one root element, found ${roots.length}`)
  return roots[0]!
}

/** Child elements of `n` named `name`. */
export function xmlChildren(n: XmlNode, name: string): XmlNode[] {
  return n.children.filter((c) => c.name === name)
}
/** First child element of `n` named `name`, or null. */
export function xmlChild(n: XmlNode | null, name: string): XmlNode | null {
  return n ? (n.children.find((c) => c.name === name) ?? null) : null
}

// ---------------------------------------------------------------------------------------------
// Namespace-aware tree (OVF envelopes: DSP0243 qualifies elements and attributes by namespace URI)

/** The namespace URI the `xml:` prefix is bound to (Namespaces in XML 1.0, section 3). */
export const XML_NAMESPACE = 'http://www.w3.org/XML/1998/namespace'

/** An attribute of a {@link XEl}: namespace URI (`''` when unqualified), local name, decoded value. */
export interface XAttr {
  ns: string
  local: string
  value: string
}
/** An element with its namespace URI resolved: local name, attributes, child elements, trimmed text (text and CDATA). */
export interface XEl {
  ns: string
  local: string
  attrs: XAttr[]
  children: XEl[]
  text: string
}

function splitQName(q: string): [string | null, string] {
  const i = q.indexOf(':')
  return i < 0 ? [null, q] : [q.slice(0, i), q.slice(i + 1)]
}

/** Builds the namespace-resolved tree from fast-xml-parser's `preserveOrder` output. */
function buildTree(nodes: unknown[], scope: Map<string, string>, label: string, depth: number): XEl[] {
  const out: XEl[] = []
  if (depth > 200) throw malformed(label, 'XML nested too deeply')
  for (const node of nodes) {
    if (!node || typeof node !== 'object') continue
    const keys = Object.keys(node).filter((k) => k !== ':@' && k !== '#text' && k !== '#cdata')
    if (keys.length !== 1) continue
    const qname = keys[0]!
    if (qname.startsWith(UNSAFE_MARK) || qname.startsWith('?') || qname.startsWith('!')) continue
    const rawAttrs = ((node as Record<string, unknown>)[':@'] ?? {}) as Record<string, unknown>
    // Namespace declarations of this element.
    let local = scope
    for (const [k, v] of Object.entries(rawAttrs)) {
      if (typeof v !== 'string') continue
      if (k === 'xmlns' || k.startsWith('xmlns:')) {
        if (local === scope) local = new Map(scope)
        local.set(k === 'xmlns' ? '' : k.slice(6), decodeXmlText(v, label))
      }
    }
    const [prefix, lname] = splitQName(qname)
    const ns = prefix === null ? (local.get('') ?? '') : local.get(prefix)
    if (ns === undefined) throw malformed(label, `undeclared namespace prefix ${JSON.stringify(prefix)} on element ${JSON.stringify(qname)}`)
    const attrs: XAttr[] = []
    for (const [k, v] of Object.entries(rawAttrs)) {
      if (typeof v !== 'string' || k === 'xmlns' || k.startsWith('xmlns:') || k.startsWith(UNSAFE_MARK)) continue
      const [ap, al] = splitQName(k)
      if (UNSAFE_NAMES.has(al)) continue
      let ans = ''
      if (ap === 'xml') ans = XML_NAMESPACE
      else if (ap !== null) {
        const u = local.get(ap)
        if (u === undefined) throw malformed(label, `undeclared namespace prefix ${JSON.stringify(ap)} on attribute ${JSON.stringify(k)}`)
        ans = u
      }
      attrs.push({ ns: ans, local: al, value: decodeXmlText(v, label) })
    }
    const kids = (node as Record<string, unknown>)[qname]
    const children: XEl[] = []
    let text = ''
    if (Array.isArray(kids)) {
      for (const k of kids) {
        if (k && typeof k === 'object') {
          const t = (k as Record<string, unknown>)['#text']
          if (typeof t === 'string' || typeof t === 'number') text += decodeXmlText(String(t), label)
          const c = (k as Record<string, unknown>)['#cdata']
          if (Array.isArray(c))
            for (const ct of c) if (ct && typeof (ct as Record<string, unknown>)['#text'] === 'string') text += (ct as Record<string, string>)['#text']
        }
      }
      children.push(...buildTree(kids, local, label, depth + 1))
    }
    if (UNSAFE_NAMES.has(lname)) continue
    out.push({ ns, local: lname, attrs, children, text: text.trim() })
  }
  return out
}

/**
 * Parses XML text into the namespace-resolved tree and returns the root element. Elements and
 * attributes with unsafe local names are dropped. `E_MIG_MALFORMED_ARCHIVE` (`<label>: <reason>`):
 * DOCTYPE or ENTITY declarations, XML that is not well-formed, undeclared prefixes,
 * non-predefined entities, nesting deeper than 200, zero or several roots.
 */
export function parseNamespacedXml(xml: string, label: string): XEl {
  const raw = parseOrderedXml(xml, label, { trim: true, cdata: true, maxNestedTags: 200 })
  const roots = buildTree(raw, new Map([['xml', XML_NAMESPACE]]), label, 0)
  if (roots.length !== 1) throw malformed(label, `expected one root element, found ${roots.length}`)
  return roots[0]!
}

/** The value of attribute `local` in one of the namespaces `nss` (or, with `unqualifiedFallback`, unqualified), or null. */
export function attr(el: XEl, nss: readonly string[], local: string, unqualifiedFallback = true): string | null {
  for (const a of el.attrs) if (a.local === local && nss.includes(a.ns)) return a.value
  if (unqualifiedFallback) for (const a of el.attrs) if (a.local === local && a.ns === '') return a.value
  return null
}
/** Child elements named `local` in one of the namespaces `nss` (any namespace when null). */
export function kids(el: XEl, nss: readonly string[] | null, local: string): XEl[] {
  return el.children.filter((c) => c.local === local && (nss === null || nss.includes(c.ns)))
}
/** The first child element named `local` in one of the namespaces `nss` (any when null), or null. */
export function kid(el: XEl, nss: readonly string[] | null, local: string): XEl | null {
  return el.children.find((c) => c.local === local && (nss === null || nss.includes(c.ns))) ?? null
}
/** The text of an element, null when absent or empty. */
export function textOf(el: XEl | null): string | null {
  if (!el) return null
  return el.text === '' ? null : el.text
}
