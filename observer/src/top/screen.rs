//! The full-screen view: a ratatui table over crossterm. The terminal is
//! put back (raw mode off, main screen, cursor shown) when the screen is
//! dropped, which covers `q`, Ctrl-C (a key in raw mode), SIGTERM (the loop
//! ends) and errors; a panic restores it from the panic hook, before the
//! message is printed.
use std::{
    io::{self, Stdout},
    sync::atomic::{AtomicI32, Ordering},
    time::Duration,
};

use ratatui::{
    backend::CrosstermBackend,
    crossterm::{
        cursor,
        event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
        execute,
        terminal::{self, EnterAlternateScreen, LeaveAlternateScreen},
    },
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Cell, Paragraph, Row as TableRow, Table},
    Terminal,
};

use super::{format, View};

pub struct Screen {
    terminal: Terminal<CrosstermBackend<Stdout>>,
}

/// What the keys pressed since the last look asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    Nothing,
    /// The view changed (sort, filter, size): draw again now.
    Redraw,
    Quit,
}

/// The real stderr while /dev/null stands in for it (-1: not replaced).
/// A static, so the panic hook can put it back before the message.
static SAVED_STDERR: AtomicI32 = AtomicI32::new(-1);

/// Points stderr at /dev/null while the screen is up: a warning or a
/// "probing" line printed over the screen would stay there, garbled, until
/// the cells under it change.
fn silence_stderr() {
    use std::os::fd::AsRawFd;
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else { return };
    // SAFETY: dup and dup2 on descriptors this process owns.
    unsafe {
        let saved = libc::dup(libc::STDERR_FILENO);
        if saved >= 0 && libc::dup2(null.as_raw_fd(), libc::STDERR_FILENO) >= 0 {
            SAVED_STDERR.store(saved, Ordering::SeqCst);
        }
    }
}

fn restore() {
    let saved = SAVED_STDERR.swap(-1, Ordering::SeqCst);
    if saved >= 0 {
        // SAFETY: the saved descriptor is ours; it goes back onto stderr
        // and is closed.
        unsafe {
            libc::dup2(saved, libc::STDERR_FILENO);
            libc::close(saved);
        }
    }
    // Each step is attempted even if one fails: a half-restored terminal
    // is worse than an error nobody reads.
    let _ = terminal::disable_raw_mode();
    let _ = execute!(io::stdout(), LeaveAlternateScreen, cursor::Show);
}

impl Screen {
    pub fn open() -> io::Result<Self> {
        terminal::enable_raw_mode()?;
        if let Err(e) = execute!(io::stdout(), EnterAlternateScreen, cursor::Hide) {
            restore();
            return Err(e);
        }
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
        match Terminal::new(CrosstermBackend::new(io::stdout())) {
            Ok(terminal) => {
                silence_stderr();
                Ok(Self { terminal })
            }
            Err(e) => {
                restore();
                Err(e)
            }
        }
    }

    /// Handles every key and resize already queued, waiting at most `wait`
    /// for the first one.
    pub fn input(&mut self, view: &mut View, wait: Duration) -> io::Result<Input> {
        let mut input = Input::Nothing;
        let mut wait = wait;
        while event::poll(wait)? {
            wait = Duration::ZERO;
            match event::read()? {
                Event::Resize(..) => input = Input::Redraw,
                Event::Key(key) if key.kind != KeyEventKind::Release => {
                    let ctrl_c =
                        key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c');
                    if ctrl_c {
                        return Ok(Input::Quit);
                    }
                    if view.editing {
                        match key.code {
                            KeyCode::Enter => view.editing = false,
                            KeyCode::Esc => {
                                view.editing = false;
                                view.filter.clear();
                            }
                            KeyCode::Backspace => {
                                view.filter.pop();
                            }
                            KeyCode::Char(c) => view.filter.push(c),
                            _ => {}
                        }
                        input = Input::Redraw;
                        continue;
                    }
                    match key.code {
                        KeyCode::Char('q') => return Ok(Input::Quit),
                        KeyCode::Char('s') => view.sort = view.sort.next(),
                        KeyCode::Char('/') => view.editing = true,
                        KeyCode::Esc => view.filter.clear(),
                        _ => continue,
                    }
                    input = Input::Redraw;
                }
                _ => {}
            }
        }
        Ok(input)
    }

    pub fn draw(&mut self, view: &View) -> io::Result<()> {
        self.terminal.draw(|frame| {
            let [header, table, footer] =
                Layout::vertical([Constraint::Length(1), Constraint::Min(1), Constraint::Length(1)])
                    .areas(frame.area());
            frame.render_widget(Paragraph::new(Line::from(view.header())), header);
            let rows = view.shown();
            let fit = format::fitting(table.width);
            let widths: Vec<Constraint> =
                format::WIDTHS[..fit].iter().map(|w| Constraint::Length(*w)).collect();
            let bold = Style::default().add_modifier(Modifier::BOLD);
            let table_rows = rows.iter().map(|r| {
                let style = if r.gpu_failures + r.crashes + r.oom_kills + r.abnormal_exits + r.gpu_stalls > 0
                {
                    bold
                } else {
                    Style::default()
                };
                TableRow::new(format::screen_cells(r).into_iter().take(fit).map(Cell::from)).style(style)
            });
            let widget = Table::new(table_rows, widths)
                .header(
                    TableRow::new(format::HEADERS[..fit].iter().map(|h| Cell::from(*h)))
                        .style(Style::default().add_modifier(Modifier::REVERSED)),
                )
                .column_spacing(1);
            frame.render_widget(widget, table);
            frame.render_widget(Paragraph::new(Line::from(view.footer())), footer);
        })?;
        Ok(())
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore();
    }
}
