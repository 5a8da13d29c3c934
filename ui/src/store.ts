/**
 * The console's shared state: every job (from `GET /migrations`, kept current by the SSE
 * stream and fetched again on every reconnection so nothing missed while the server was away is
 * lost) and the connection state shown in the header.
 */
import { useEffect, useState } from 'preact/hooks'
import type { Job } from '../../lib/job.ts'
import { api } from './api.ts'
import { applyProgress, fresher, openStream, type Connection } from './live.ts'

interface State {
  jobs: Map<string, Job>
  connection: Connection
  loadError: string | null
}

const state: State = { jobs: new Map(), connection: 'connecting', loadError: null }
const listeners = new Set<() => void>()
const emit = () => {
  for (const l of listeners) l()
}

/** Puts a job (from an answer of the API or an event) into the store, unless it holds a fresher copy. */
export function putJob(job: Job): void {
  state.jobs.set(job.id, fresher(state.jobs.get(job.id), job))
  emit()
}

async function reload(): Promise<void> {
  try {
    const { items } = await api<{ items: Job[] }>('GET', '/migrations')
    state.jobs = new Map(items.map((j) => [j.id, fresher(state.jobs.get(j.id), j)]))
    state.loadError = null
  } catch (e) {
    state.loadError = (e as Error).message
  }
  emit()
}

let started = false
/** Starts the global stream once (the list and header follow it). */
export function startStore(): void {
  if (started) return
  started = true
  openStream(
    {},
    {
      migration: putJob,
      progress(p) {
        const j = state.jobs.get(p.id)
        if (j) putJob(applyProgress(j, p))
      },
      connection(c) {
        state.connection = c
        emit()
      },
      open: () => void reload(),
    },
  )
}

/** The store's state; the calling component re-renders on every change. */
export function useStore(): State {
  const [, setTick] = useState(0)
  useEffect(() => {
    const l = () => setTick((t) => t + 1)
    listeners.add(l)
    return () => void listeners.delete(l)
  }, [])
  return state
}
