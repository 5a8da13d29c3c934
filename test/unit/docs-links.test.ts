/**
 * Every relative link of README.md and docs/**.md resolves inside the checkout: the target file
 * exists, and a `#fragment` names a heading of the target (GitHub's heading slugs). Links inside
 * fenced code blocks and absolute URLs (`http:`, `https:`, `mailto:`) are not checked.
 */
import { describe, expect, test } from 'bun:test'
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs'
import path from 'node:path'

const REPO = path.resolve(import.meta.dir, '../..')

/** The Markdown files whose links are checked: README.md and every .md under docs/. */
function markdownFiles(): string[] {
  const out = [path.join(REPO, 'README.md')]
  const walk = (dir: string): void => {
    for (const name of readdirSync(dir)) {
      const p = path.join(dir, name)
      if (statSync(p).isDirectory()) walk(p)
      else if (name.endsWith('.md')) out.push(p)
    }
  }
  walk(path.join(REPO, 'docs'))
  return out
}

/** The text outside fenced code blocks (``` lines), so code samples are not read as links. */
function prose(text: string): string {
  let fenced = false
  return text
    .split('\n')
    .filter((line) => {
      if (/^\s*```/.test(line)) {
        fenced = !fenced
        return false
      }
      return !fenced
    })
    .join('\n')
}

/** GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` dropped, spaces to `-`. */
export function slug(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N} _-]/gu, '')
    .replace(/ /g, '-')
}

/** The anchors of a Markdown file's headings. */
function anchors(file: string): Set<string> {
  const set = new Set<string>()
  for (const line of prose(readFileSync(file, 'utf8')).split('\n')) {
    const m = /^#{1,6}\s+(.*)$/.exec(line)
    if (m?.[1]) set.add(slug(m[1]))
  }
  return set
}

/** Every `[text](target)` and `![alt](target)` link target of a file's prose, without a title. */
function links(file: string): string[] {
  const text = prose(readFileSync(file, 'utf8')).replace(/`[^`\n]*`/g, '')
  return [...text.matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)].map((m) => m[1] as string)
}

/** Repository paths named in code spans of a file's prose (`lib/x.ts`, `test/y.test.ts`), without globs or placeholders. */
function namedPaths(file: string): string[] {
  const text = prose(readFileSync(file, 'utf8'))
  return [...text.matchAll(/`((?:lib|runtime|handlers|cli|test|bench|fixtures|demo|scripts|docs)\/[\w./-]+\.(?:ts|md|go|sh|service))`/g)].map(
    (m) => m[1] as string,
  )
}

describe('documentation links', () => {
  test('the slug rule matches GitHub on headings with code and punctuation', () => {
    expect(slug('Warm cutover on command (roadmap v0.6)')).toBe('warm-cutover-on-command-roadmap-v06')
    expect(slug('The `migrator` command')).toBe('the-migrator-command')
  })

  const files = markdownFiles()
  test('README.md and docs/ have Markdown files with links', () => {
    expect(files.length).toBeGreaterThan(5)
    expect(links(path.join(REPO, 'README.md')).length).toBeGreaterThan(5)
    expect(namedPaths(path.join(REPO, 'docs/formats.md')).length).toBeGreaterThan(20)
  })

  for (const file of files) {
    test(`every relative link of ${path.relative(REPO, file)} resolves`, () => {
      const broken: string[] = []
      for (const link of links(file)) {
        if (/^(https?:|mailto:)/.test(link)) continue
        const [target = '', fragment] = link.split('#', 2)
        const resolved = target === '' ? file : path.resolve(path.dirname(file), decodeURIComponent(target))
        if (!resolved.startsWith(REPO) || !existsSync(resolved)) {
          broken.push(`${link}: no such file`)
          continue
        }
        if (fragment && resolved.endsWith('.md') && !anchors(resolved).has(fragment)) broken.push(`${link}: no heading #${fragment}`)
      }
      expect(broken).toEqual([])
    })

    test(`every repository path ${path.relative(REPO, file)} names in code exists`, () => {
      const missing = namedPaths(file).filter((p) => !existsSync(path.join(REPO, p)) && !existsSync(path.join(REPO, 'lib', p)))
      expect(missing).toEqual([])
    })
  }
})
