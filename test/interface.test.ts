import { runFolder } from './helpers/folder.js'

await runFolder(new URL('./interface/', import.meta.url))
