//! The symbol map behind each prompt's `## Relevant Symbols` section: asking for it at rush
//! start, taking it (or its update after a level merge) from the blocking job that built it, and
//! cutting one task's section from it.
//!
//! Leases wait while the first map of a rush is built, so every task of the first level gets
//! its section; a map that cannot be built only costs the sections (the rush goes on, and the
//! next level merge tries again from scratch).

use zerg_proto::graph::Files;

use super::*;

impl Rush {
    /// Whether leases must wait for the symbol map; asks for it when nobody has yet.
    pub(super) fn wait_for_symbols(&mut self, fx: &mut Effects) -> bool {
        if !self.config.symbols.enabled || self.symbols.is_some() {
            return false;
        }
        if !self.indexing {
            self.indexing = true;
            fx.index = Some(IndexJob {
                repo: self.paths.repo.clone(),
                commit: self.doc.rush.staging_head.clone(),
                settings: self.config.symbols.clone(),
                git: self.git(),
            });
        }
        true
    }

    /// The symbol map asked for by [`Rush::wait_for_symbols`] was built (or could not be).
    pub fn on_indexed(
        &mut self,
        result: Indexed,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        if !self.indexing {
            return;
        }
        self.indexing = false;
        match result {
            Ok((index, stats)) => {
                let c = index.counts();
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Info,
                    "symbols_indexed",
                    format!(
                        "Symbol map built: {} files, {} definitions ({} parsed, {} from the cache); skipped {} in other languages, {} binary, {} too large, {} unparsable",
                        c.indexed,
                        c.definitions,
                        stats.parsed,
                        stats.cached,
                        c.other_language,
                        c.binary,
                        c.too_large,
                        c.unparsable
                    ),
                    json!({"commit": index.commit(), "counts": c, "stats": stats}),
                );
                self.symbols = Some(Arc::new(index));
            }
            Err(why) => {
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Warn,
                    "symbols_failed",
                    format!(
                        "Symbol map could not be built ({why}); prompts have no Relevant Symbols section until the next level"
                    ),
                    json!({"error": why}),
                );
                self.symbols = Some(Arc::new(SymbolIndex::default()));
            }
        }
        self.dispatch(now, wall, fx);
    }

    /// The symbol map moved onto a level's merged head, handed over with the merge result just
    /// before [`Rush::on_merged`]; it is taken only when that merge is.
    pub fn on_reindexed(
        &mut self,
        level: u32,
        merge: &MergeResult,
        result: Indexed,
        wall: SystemTime,
    ) {
        if self.state() != RushState::Running
            || level != self.doc.current_level
            || !matches!(merge, MergeResult::Merged(_))
        {
            return;
        }
        match result {
            Ok((index, stats)) => {
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Info,
                    "symbols_updated",
                    format!(
                        "Symbol map updated after level {level}: {} changed files ({} parsed, {} from the cache), {} unchanged",
                        stats.changed, stats.parsed, stats.cached, stats.reused
                    ),
                    json!({"level": level, "commit": index.commit(), "stats": stats}),
                );
                self.symbols = Some(Arc::new(index));
            }
            Err(why) => {
                // The old map still describes most of the code; the next update starts from
                // its commit, so nothing is lost for good.
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Warn,
                    "symbols_failed",
                    format!("Symbol map not updated after level {level}: {why}"),
                    json!({"level": level, "error": why}),
                );
            }
        }
    }

    /// The `## Relevant Symbols` section of a task with these files; empty when the feature
    /// is off or the map has nothing for it.
    pub(super) fn relevant_symbols(&self, files: &Files) -> String {
        match &self.symbols {
            Some(index) if self.config.symbols.enabled => {
                zerg_symbols::task_section(index, files, self.config.symbols.max_bytes_per_task)
            }
            _ => String::new(),
        }
    }
}
