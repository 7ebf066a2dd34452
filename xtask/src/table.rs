//! A plain-text table with aligned columns.

/// How a column's cells are aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Pad on the right (text).
    Left,
    /// Pad on the left (numbers).
    Right,
}

/// Render `rows` under `header`, columns separated by ` | `, with a dashed
/// rule below the header. Every line ends with `\n`; trailing spaces are
/// trimmed.
pub fn render(header: &[&str], align: &[Align], rows: &[Vec<String>]) -> String {
    let columns = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| -> String {
        let mut out = String::new();
        for (i, cell) in cells.enumerate().take(columns) {
            if i > 0 {
                out.push_str(" | ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            let right = align.get(i).copied().unwrap_or(Align::Left) == Align::Right;
            if right {
                out.push_str(&" ".repeat(pad));
            }
            out.push_str(cell);
            if !right {
                out.push_str(&" ".repeat(pad));
            }
        }
        let mut out = out.trim_end().to_string();
        out.push('\n');
        out
    };
    let mut text = line(&mut header.iter().copied());
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    text.push_str(&rule.join("-+-"));
    text.push('\n');
    for row in rows {
        text.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_columns() {
        let rows = vec![
            vec!["cpu".to_string(), "1.500".to_string(), "x".to_string()],
            vec!["vulkan".to_string(), "12.000".to_string(), "".to_string()],
        ];
        let text = render(
            &["backend", "value", "note"],
            &[Align::Left, Align::Right, Align::Left],
            &rows,
        );
        assert_eq!(
            text,
            "backend |  value | note\n\
             --------+--------+-----\n\
             cpu     |  1.500 | x\n\
             vulkan  | 12.000 |\n"
        );
    }
}
