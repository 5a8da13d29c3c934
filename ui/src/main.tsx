/**
 * The web console: a single page served by the migrator at `{base}/ui/`, talking only to the
 * public API and its SSE stream. Hash routes: `#/` migrations, `#/migrations/<id>` one job,
 * `#/new` from a file, `#/sources` vSphere sources, `#/plans` bulk plans, `#/plans/<id>` one plan.
 */
import { render } from 'preact'
import { useEffect, useState } from 'preact/hooks'
import { NewMigrationPage } from './pages/new.tsx'
import { JobPage, MigrationsPage } from './pages/migrations.tsx'
import { PlanPage, PlansPage } from './pages/plans.tsx'
import { SourcesPage } from './pages/sources.tsx'
import { startStore, useStore } from './store.ts'
import './style.css'

function useHash(): string {
  const [hash, setHash] = useState(location.hash || '#/')
  useEffect(() => {
    const on = () => setHash(location.hash || '#/')
    addEventListener('hashchange', on)
    return () => removeEventListener('hashchange', on)
  }, [])
  return hash
}

function ConnectionState() {
  const { connection } = useStore()
  const text = connection === 'live' ? 'live' : connection === 'lost' ? 'connection lost, reconnecting…' : 'connecting…'
  return (
    <span class={`conn ${connection}`} data-testid="connection" data-connection={connection} role="status">
      {text}
    </span>
  )
}

function App() {
  const hash = useHash()
  const job = /^#\/migrations\/([^/]+)$/.exec(hash)
  const plan = /^#\/plans\/([^/]+)$/.exec(hash)
  // keyed by id: another job's (plan's) page starts from a clean state, never shows the previous one
  const page = job ? (
    <JobPage key={job[1]} id={decodeURIComponent(job[1]!)} />
  ) : plan ? (
    <PlanPage key={plan[1]} id={decodeURIComponent(plan[1]!)} />
  ) : hash === '#/new' ? (
    <NewMigrationPage />
  ) : hash === '#/sources' ? (
    <SourcesPage />
  ) : hash === '#/plans' ? (
    <PlansPage />
  ) : (
    <MigrationsPage />
  )
  const tab = (href: string, label: string, active: boolean) => (
    <a href={href} class={active ? 'active' : ''}>
      {label}
    </a>
  )
  return (
    <>
      <header>
        <h1>VM migrator</h1>
        <nav>
          {tab('#/', 'Migrations', hash === '#/' || !!job)}
          {tab('#/new', 'New from a file', hash === '#/new')}
          {tab('#/plans', 'Plans', hash === '#/plans' || !!plan)}
          {tab('#/sources', 'Sources', hash === '#/sources')}
        </nav>
        <ConnectionState />
      </header>
      <main>{page}</main>
    </>
  )
}

startStore()
render(<App />, document.getElementById('app')!)
